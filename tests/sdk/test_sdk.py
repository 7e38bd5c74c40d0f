"""The SDK against a real server (uvicorn + the test database)."""

from __future__ import annotations

import threading
from decimal import Decimal

import httpx
import pytest
from gpugeek import (
    AuthenticationError,
    BudgetExceeded,
    Client,
    Cluster,
    Conflict,
    ConnectionFailed,
    NotFound,
    QuotaExceeded,
    ServerError,
    ValidationError,
)
from gpugeek.errors import error_for
from gpugeek.spec import job_payload

from console.services.tokens import api_token_create
from jobs.models import Job
from jobs.services import tenant_secret_set
from jobs.tasks import job_cancel_task
from tests.sdk.conftest import PRINTS_FOREVER, counting_program, cpu_spec, dispatch
from tests.sdk.proxy import LossyProxy

pytestmark = pytest.mark.integration

COUNT_LINES = counting_program(300, pause_every=50, pause=0.5)


def test_documented_spelling_resolves_slug_and_node_split(gg):
    """GPU pools here are the demo catalog's Kubernetes pools, and this installation
    runs only the local backend: the spelling is checked on the request the SDK builds
    (from the server's /gpu-types and /pools) and on the server's answer to it."""
    offers = gg.list_offers(gpu_type="a100-80gb", region="us-west")
    assert offers and {o.gpu_type for o in offers} == {"a100-80gb"}
    pools = [p for p in gg.pools() if p.gpu_type == "a100-80gb" and p.region == "us-west"]
    assert pools and {p.gpus_per_node for p in pools} == {8}

    spec = {"gpu_type": "A100-80GB", "count": 8, "region": "us-west", "spot_ratio": 0.7,
            "image": "pytorch-2-5-cuda12-4", "command": ["torchrun", "train.py"]}  # fmt: skip
    body = job_payload(gg, spec)
    assert (body["gpu_type"], body["nodes"], body["gpus_per_node"]) == ("a100-80gb", 1, 8)
    assert body["spot_ratio"] == "0.7" and body["name"]
    for count, split in ((16, (2, 8)), (32, (4, 8)), (4, (1, 4)), (1, (1, 1))):
        body = job_payload(gg, {**spec, "gpu_type": "A100 80GB SXM", "count": count})
        assert (body["nodes"], body["gpus_per_node"]) == split, count
    with pytest.raises(ValidationError) as uneven:
        job_payload(gg, {**spec, "count": 12})
    assert "count" in uneven.value.errors
    with pytest.raises(ValidationError) as elsewhere:
        job_payload(gg, {**spec, "gpu_type": "ascend-910b", "count": 8})  # eu-central only
    assert "gpu_type" in elsewhere.value.errors
    # The API's own fields pass through unchanged; a command string is split.
    raw = job_payload(gg, {"name": "raw", "gpu_type": "a100-80gb", "gpus_per_node": 4,
                           "nodes": 1, "image": "i", "command": "torchrun train.py"})  # fmt: skip
    assert (raw["nodes"], raw["gpus_per_node"], raw["command"]) == (1, 4, ["torchrun", "train.py"])

    # The server sees the resolved slug (it has no Kubernetes backend to place it on).
    with pytest.raises(ValidationError) as refused:
        Cluster.create(spec)
    assert "a100-80gb" in refused.value.detail and refused.value.code == "invalid"


def test_cpu_job_fields_and_409(gg):
    cluster = Cluster.create(cpu_spec("print(1)", env={"A": "1"}, project="p"))
    job = cluster.job
    assert (job.region, job.image, job.cpus, job.gpu_type) == ("local", "python-3.11", 1, None)
    assert job.env == {"A": "1"} and job.project == "p" and job.is_active
    with pytest.raises(Conflict) as refused:  # only a running job can be paused
        cluster.pause()
    assert refused.value.status == 409 and "running" in refused.value.detail
    assert cluster.cancel().status == "cancelled"
    assert not cluster.job.is_active
    assert cluster.cancel().status == "cancelled"  # cancelling twice is harmless
    assert cluster.cost() == Decimal(0)
    assert [j.id for j in gg.jobs()] == [cluster.id]


def test_lists_follow_next_links(gg):
    ids = {Cluster.create(cpu_spec("print(1)")).id for _ in range(3)}
    pages = []
    original = gg.http.request

    def spy(method, path, **kwargs):
        pages.append(path)
        return original(method, path, **kwargs)

    gg.http.request = spy
    listed = [row["id"] for row in gg.http.paginate("jobs", page_size=1)]
    assert set(listed) == ids and len(listed) == 3
    assert len(pages) == 3 and "cursor=" in pages[-1]


def test_estimate_and_billing_lists(gg):
    estimate = gg.estimate(gpu_type="A100-80GB", count=16, region="us-west", hours=2)
    assert estimate.units == 16 and Decimal(estimate.total) > 0
    assert Decimal(estimate.total) == Decimal(estimate.hourly) * 2
    assert gg.budgets() == []
    assert gg.invoices() == []
    types = {g.slug for g in gg.gpu_types()}
    assert {"a100-80gb", "h100-80gb"} <= types


def test_set_budget_creates_or_changes_by_name(gg, monkeypatch):
    first = gg.set_budget("Team", amount=100)
    assert Decimal(first.amount) == 100 and first.action == "pause_non_critical"
    # A create that finds the name taken (made meanwhile, or a POST retried after its
    # answer was lost) changes that budget instead: POST answers 409, then PATCH.
    looked = []
    real = gg.budget

    def stale(name):
        looked.append(name)
        return None if len(looked) == 1 else real(name)

    monkeypatch.setattr(gg, "budget", stale)
    again = gg.set_budget("Team", amount="250.50", thresholds=[80], action="alert_only")
    assert again.id == first.id and len(looked) == 2
    assert (Decimal(again.amount), again.thresholds, again.action) == (
        Decimal("250.5"), [80], "alert_only"
    )  # fmt: skip
    assert [b.name for b in gg.budgets()] == ["Team"]
    gg.delete_budget("Team")
    assert gg.budgets() == []


def test_typed_errors(gg, asgi_server):
    with pytest.raises(ValidationError) as invalid:
        gg.http.post("jobs", {"name": "", "image": "python-3.11", "command": []}, create=True)
    assert invalid.value.status == 400
    assert {"name", "command"} <= set(invalid.value.errors)
    with pytest.raises(ValidationError) as bad_image:
        gg.create_cluster(cpu_spec("print(1)", image="no-such-image"))
    assert bad_image.value.errors or bad_image.value.detail
    with pytest.raises(ValidationError) as unknown_gpu:
        gg.create_cluster({"gpu_type": "Z9000", "count": 8, "image": "x", "command": ["x"]})
    assert "gpu_type" in unknown_gpu.value.errors
    with pytest.raises(NotFound) as missing:
        gg.job(987654)
    assert missing.value.status == 404 and missing.value.detail
    stranger = Client(url=asgi_server.url, token="ggt_not-a-real-token")
    with stranger, pytest.raises(AuthenticationError) as denied:
        stranger.list_offers()
    assert denied.value.status in (401, 403)


def test_organisation_secrets_count_toward_the_environment_bound(gg, world):
    """The SDK launches through the API, so through the one validation (audit, issue 26)."""
    names = [f"BIG_{n}" for n in range(8)]
    for name in names:
        tenant_secret_set(tenant=world.tenant, user=world.owner, name=name, value="s" * 32768)
    with pytest.raises(ValidationError) as refused:
        gg.create_cluster(cpu_spec("print(1)", secrets=names))
    assert "128 KiB" in " ".join(refused.value.errors["secrets"])
    assert not Job.objects.exists()


def test_error_codes_map_to_types():
    """The server's codes (console/api/errors.py): payment_required is 402 (a used-up
    budget, billing.budgets.services.BudgetLaunchPolicy); the envelope carries field errors."""
    budget = error_for(402, {"detail": "Budget used up", "code": "payment_required"})
    assert isinstance(budget, BudgetExceeded) and budget.code == "payment_required"
    assert isinstance(error_for(403, {"detail": "x", "code": "quota_exceeded"}), QuotaExceeded)
    assert isinstance(error_for(409, {"detail": "x", "code": "conflict"}), Conflict)
    invalid = error_for(400, {"detail": "Bad", "code": "invalid", "region": ["Unknown."]})
    assert isinstance(invalid, ValidationError) and invalid.errors == {"region": ["Unknown."]}
    bare = error_for(400, {"name": ["This field may not be blank."]})
    assert bare.detail == "name: This field may not be blank." and bare.errors["name"]
    envelope = error_for(400, {"detail": "Bad", "errors": {"image": ["Unknown."]}})
    assert envelope.errors == {"image": ["Unknown."]}
    # The uniform envelope of every refusal: detail, code, fields under their names.
    missing = error_for(404, {"detail": "Not found.", "code": "not_found"})
    assert isinstance(missing, NotFound) and (missing.code, missing.errors) == ("not_found", {})
    denied = error_for(403, {"detail": "No.", "code": "permission_denied"})
    assert isinstance(denied, AuthenticationError) and str(denied) == "No."
    field = error_for(
        400, {"detail": "since_line: Bad.", "code": "invalid", "since_line": ["Bad."]}
    )
    assert field.errors == {"since_line": ["Bad."]} and str(field) == "since_line: Bad."


def test_idempotency_key_makes_one_job(gg):
    spec = cpu_spec("print(1)")
    first = Cluster.create(spec, idempotency_key="run-42")
    again = Cluster.create(spec, idempotency_key="run-42")
    assert first.id == again.id
    assert Job.objects.filter(idempotency_key="run-42").count() == 1
    other = Cluster.create(spec)  # a fresh key: a new job
    assert other.id != first.id
    assert Job.objects.count() == 2


def test_retries_on_503_and_a_retried_create_makes_one_job(asgi_server, api_token):
    proxy = LossyProxy(asgi_server.url, fail_first=1)
    try:
        with Client(url=proxy.url, token=api_token, backoff=0.01) as gg:
            assert gg.list_offers(region="us-west")  # after one 503
            cluster = Cluster.create(cpu_spec("print(1)"), client=gg)
        posts = [s for s in proxy.seen if s[0] == "POST"]
        assert len(posts) == 2 and posts[0][2] and posts[0][2] == posts[1][2]
        assert Job.objects.count() == 1 and Job.objects.get().pk == cluster.id
        proxy.fail_first = 10**6  # always unavailable: bounded retries, then a typed error
        before = len(proxy.seen)
        gg = Client(url=proxy.url, token=api_token, backoff=0.01, retries=3)
        with gg, pytest.raises(ServerError) as down:
            gg.list_offers()
        assert down.value.status == 503 and len(proxy.seen) - before == 4
    finally:
        proxy.close()


def test_connection_errors_are_retried_then_typed():
    calls = []

    def refuse(request):
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    gg = Client(url="http://gg.invalid", token="t", backoff=0.001, retries=2,
                transport=httpx.MockTransport(refuse))  # fmt: skip
    with gg, pytest.raises(ConnectionFailed):
        gg.list_offers()
    assert len(calls) == 3


def test_cpu_job_lifecycle_wait_logs_follow(gg, watcher_process, asgi_server, api_token):
    cluster = Cluster.create(cpu_spec(COUNT_LINES))
    assert cluster.job.backend == "local" and cluster.job.gpu_type is None
    # A second follower polls (stream=False) through a flaky link (503s, dropped
    # connections; no transport retries): it must resume after its last line each time.
    # The first one follows the log stream (tests/sdk/test_log_stream.py breaks that).
    proxy = LossyProxy(asgi_server.url, fail_first=0, flaky_logs=True)
    flaky = Client(url=proxy.url, token=api_token, retries=0)
    flaky_lines: list = []
    follower = threading.Thread(
        target=lambda: flaky_lines.extend(
            flaky.cluster(cluster.id).logs(
                follow=True, stream=False, poll=0.2, limit=17, timeout=120
            )
        )
    )
    follower.start()
    dispatch(cluster.id)
    cluster.wait(("running", "succeeded"), timeout=60, poll=0.3)
    lines = list(cluster.logs(follow=True, poll=0.3, limit=40, timeout=120))
    numbers = [line.line_no for line in lines]
    assert numbers == list(range(1, len(numbers) + 1)), "gap or duplicate"
    assert [line.text for line in lines] == [f"line {n}" for n in range(1, 301)]
    follower.join(timeout=60)
    flaky.close()
    proxy.close()
    assert proxy.log_reads >= 5, "the flaky link was exercised"
    assert [(x.line_no, x.text) for x in flaky_lines] == [(x.line_no, x.text) for x in lines]
    assert cluster.refresh().status == "succeeded"
    assert cluster.job.exit_code == 0
    assert isinstance(cluster.cost(), Decimal)
    with pytest.raises(Conflict) as finished:  # a finished job can't be cancelled: 409
        cluster.cancel()
    assert finished.value.status == 409 and "succeeded" in finished.value.detail
    # Resuming after a given line: exactly what follows it.
    tail = list(cluster.logs(since_line=295))
    assert [line.line_no for line in tail] == [296, 297, 298, 299, 300]


def test_session_cancels_on_exit(gg, watcher_process):
    with gg.session(cpu_spec(PRINTS_FOREVER)) as cluster:
        dispatch(cluster.id)
        cluster.wait("running", timeout=60, poll=0.3)
        first = next(iter(cluster.logs(follow=True, poll=0.3, timeout=30)))
        assert first.text == "tick 1"
    # A running job is cancelling until its process is seen gone: still active, billed.
    assert cluster.job.status == "cancelling" and cluster.job.is_active
    job_cancel_task(cluster.id)  # what the worker does (no worker runs here): SIGTERM
    assert cluster.wait("cancelled", timeout=60, poll=0.3).job.status == "cancelled"


def test_a_member_acts_only_on_their_own_jobs(gg, asgi_server, world):
    """The SDK gets the API's refusal: 403 permission_denied with the reason."""
    owners = gg.create_cluster(cpu_spec("print(1)"))  # gg is the owner's client
    _, raw = api_token_create(user=world.member, tenant=world.tenant, name="member")
    with Client(url=asgi_server.url, token=raw, backoff=0.05) as member:
        theirs = member.cluster(owners.id)
        with pytest.raises(AuthenticationError) as refused:
            theirs.cancel()
        assert refused.value.status == 403 and refused.value.code == "permission_denied"
        assert "only the jobs they launched" in refused.value.detail
        mine = member.create_cluster(cpu_spec("print(2)"))
        assert mine.cancel().job.status == "cancelled"  # not started yet: at once
    assert owners.refresh().status != "cancelled"
