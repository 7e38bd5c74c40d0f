"""The jobs API under /api/v1/jobs: launch (validation, queueing, idempotency), list and
inspect, the timeline and logs, the actions and their conflicts, roles and tenant scope.

The lifecycle tests run real local processes: they dispatch and observe the way the
worker and the watcher do (services.job_dispatch, services.jobs_observe), without them.
"""

from __future__ import annotations

import re
import time
from decimal import Decimal

import jsonschema
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.crypto import decrypt_json
from jobs import services
from jobs.actors import BACKEND
from jobs.backends.local import LocalBackend
from jobs.models import Job, JobStatus
from jobs.state import job_transition
from marketplace.models import NodePool
from tests.conftest import token_client
from tests.jobs.test_consumers import forget_files, write_log
from tests.jobs_helpers import advance_to

JOBS = "/api/v1/jobs"
COST = re.compile(r"^\d+\.\d{6,}$")
CONFLICT = 409


def job_url(job_id: int, action: str = "") -> str:
    return f"{JOBS}/{job_id}" + (f"/{action}" if action else "")


def body(**overrides) -> dict:
    values = {
        "name": "api job",
        "image": "python-3.11",
        "command": ["python", "-c", "print('hi')"],
        "cpus": 1,
    }
    values.update(overrides)
    return values


@pytest.fixture
def member_api(world, catalog):
    return token_client(world.member, world.tenant)


def launch(api, **overrides) -> dict:
    response = api.post(JOBS, body(**overrides), format="json")
    assert response.status_code == 201, response.content
    return response.json()


def local_cpu_pool() -> NodePool:
    return NodePool.objects.get(backend="local", gpu_type=None, tier="on_demand")


def set_status(job_id: int, *path: str) -> Job:
    """Walk a job through the state machine, as the backend would report it."""
    job = Job.objects.get(pk=job_id)
    for to in path:
        job = job_transition(job=job, to=to, actor=BACKEND, reason=to)
    return job


# --- launch ---------------------------------------------------------------------------------


def test_launch_returns_the_job_with_status_and_cost(member_api, world):
    job = launch(
        member_api,
        name="  train  ",
        project="vision",
        labels={"team": "cv"},
        env={"BATCH_SIZE": "64"},
        secret_env={"HF_TOKEN": "hf_very_secret"},
        priority="low",  # critical is for owners and admins (tests/jobs/test_hardening_host.py)
        max_runtime_minutes=30,
        checkpoint_path="/ckpt",
    )
    assert job["status"] == JobStatus.DISPATCHING
    assert job["status_reason"] == "admitted"
    assert job["attempt"] == 1
    assert COST.match(job["cost_to_date"]), job["cost_to_date"]
    assert Decimal(job["cost_to_date"]) == 0
    assert job["name"] == "train"
    assert job["image"] == "python-3.11"
    assert job["command"] == ["python", "-c", "print('hi')"]
    assert job["gpu_type"] is None and job["gpus_per_node"] == 0
    assert job["region"] == "local" and job["backend"] == "local"
    assert job["env"] == {"BATCH_SIZE": "64"}
    assert job["secret_env"] == {"HF_TOKEN": "••••••"}
    assert (job["priority"], job["max_runtime_minutes"]) == ("low", 30)

    stored = Job.objects.get(pk=job["id"])
    assert (stored.tenant, stored.created_by) == (world.tenant, world.member)
    fetched = member_api.get(job_url(job["id"]))
    assert fetched.status_code == 200
    assert fetched.json()["secret_env"] == {"HF_TOKEN": "••••••"}
    assert "hf_very_secret" not in fetched.content.decode()
    assert "hf_very_secret" not in member_api.get(JOBS).content.decode()
    assert "hf_very_secret" not in stored.secret_env_encrypted


def test_launch_over_free_capacity_is_queued_with_reason_and_position(member_api):
    pool = local_cpu_pool()
    launch(member_api, name="filler", cpus=pool.allocatable_vcpus)
    queued = launch(member_api, name="waiting", cpus=1)
    assert queued["status"] == JobStatus.QUEUED
    assert queued["status_reason"] == f"waiting for 1 vCPUs in {pool.name} (0 free)"
    assert queued["queue_position"] == 1
    assert COST.match(queued["cost_to_date"])


BAD_INPUT = {
    "unknown-image": ({"image": "no-such-image"}, "image"),
    "command-string": ({"command": "python train.py"}, "command"),
    "command-empty": ({"command": []}, "command"),
    "command-null-arg": ({"command": ["python", None]}, "command"),
    "command-nested": ({"command": ["python", ["-c"]]}, "command"),
    "command-object-arg": ({"command": [{"arg": "x"}]}, "command"),
    "env-digit-first": ({"env": {"1ST": "x"}}, "env"),
    "env-dash": ({"env": {"MY-VAR": "x"}}, "env"),
    "env-reserved": ({"env": {"GPUGEEK_JOB_ID": "1"}}, "env"),
    "secret-env-name": ({"secret_env": {"bad name": "x"}}, "secret_env"),
    "env-not-object": ({"env": ["A=1"]}, "env"),
    "runtime-zero": ({"max_runtime_minutes": 0}, "max_runtime_minutes"),
    "runtime-negative": ({"max_runtime_minutes": -5}, "max_runtime_minutes"),
    "spot-over-one": ({"spot_ratio": "1.5"}, "spot_ratio"),
    "spot-negative": ({"spot_ratio": "-0.1"}, "spot_ratio"),
    "gpu-type-without-gpus": ({"gpu_type": "h100-80gb", "gpus_per_node": 0}, "gpus_per_node"),
    "gpus-without-type": ({"gpus_per_node": 2}, "gpu_type"),
    "unknown-gpu-type": ({"gpu_type": "tpu-v9", "gpus_per_node": 1}, "gpu_type"),
    "unknown-region": ({"region": "mars-1"}, "region"),
    "bad-priority": ({"priority": "urgent"}, "priority"),
    "no-name": ({"name": ""}, "name"),
    "nodes-zero": ({"nodes": 0}, "nodes"),
    "cpus-over-pool": ({"cpus": 1024}, "cpus"),
}


@pytest.mark.parametrize(("overrides", "field"), BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_a_400_naming_the_field(member_api, overrides, field):
    response = member_api.post(JOBS, body(**overrides), format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert field in errors, errors
    assert errors[field] and all(isinstance(m, str) and m for m in errors[field])
    assert not Job.objects.exists()


@pytest.mark.parametrize("command", [["sleep", 10], ["python", 1.5]], ids=["int", "float"])
def test_command_with_number_items_is_a_400(member_api, command):
    response = member_api.post(JOBS, body(command=command), format="json")
    assert response.status_code == 400, response.content
    assert "command" in response.json()


def test_shell_metacharacters_are_kept_as_argv(member_api):
    argv = ["python", "-c", "print(1)", "; rm -rf ~", "$(id)", "a && b | c", "`x`"]
    job = launch(member_api, command=argv)
    assert job["command"] == argv
    assert Job.objects.get(pk=job["id"]).command == argv


def test_idempotency_key_returns_the_same_job(member_api, other_world):
    headers = {"HTTP_IDEMPOTENCY_KEY": "deploy-42"}
    first = member_api.post(JOBS, body(), format="json", **headers)
    retried = member_api.post(JOBS, body(), format="json", **headers)
    assert first.status_code == 201
    assert retried.status_code in (200, 201)
    assert retried.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1

    assert launch(member_api)["id"] != first.json()["id"]  # no key: a new job
    other = member_api.post(JOBS, body(), format="json", HTTP_IDEMPOTENCY_KEY="deploy-43")
    assert other.json()["id"] != first.json()["id"]
    # Keys are per tenant: another organisation's identical key is its own job.
    theirs = token_client(other_world.member, other_world.tenant).post(
        JOBS, body(), format="json", **headers
    )
    assert theirs.status_code == 201
    assert theirs.json()["id"] != first.json()["id"]
    assert Job.objects.count() == 4


# --- read -----------------------------------------------------------------------------------


def test_list_is_paged_filtered_and_scoped_to_the_tenant(member_api, other_world):
    pool = local_cpu_pool()
    running = launch(member_api, name="running", cpus=pool.allocatable_vcpus)
    queued = launch(member_api, name="queued")
    token_client(other_world.member, other_world.tenant).post(
        JOBS, body(name="theirs"), format="json"
    )

    page = member_api.get(JOBS).json()
    assert set(page) >= {"count", "next", "previous", "results"}
    assert page["count"] == 2
    assert {j["id"] for j in page["results"]} == {running["id"], queued["id"]}

    only_queued = member_api.get(JOBS, {"status": "queued"}).json()
    assert [j["id"] for j in only_queued["results"]] == [queued["id"]]
    assert member_api.get(JOBS, {"status": "succeeded"}).json()["count"] == 0
    paged = member_api.get(JOBS, {"page_size": 1}).json()
    assert len(paged["results"]) == 1 and paged["next"]


def _documented_response(api, path: str, method: str = "get", status: str = "200") -> dict:
    """The JSON schema the served OpenAPI schema gives for an operation's response, with
    the components its references resolve against."""
    schema = api.get("/api/v1/schema/", {"format": "json"}).json()
    operation = schema["paths"][path][method]
    content = operation["responses"][status]["content"]["application/json"]["schema"]
    return {**content, "components": schema["components"]}


def _resolved(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def test_the_log_page_is_what_the_schema_documents(member_api):
    """GET /jobs/{id}/logs/ was documented as returning a Job; it returns a page of lines."""
    job = launch(member_api)
    forget_files(Job.objects.get(pk=job["id"]))
    write_log(Job.objects.get(pk=job["id"]), ["epoch 1", "", "epoch 2"])
    response = member_api.get(f"{job_url(job['id'])}/logs", {"since_line": 1})
    assert response.status_code == 200
    page = response.json()
    assert [line["text"] for line in page["lines"]] == ["", "epoch 2"]

    documented = _documented_response(member_api, "/api/v1/jobs/{id}/logs/")
    jsonschema.validate(page, documented, format_checker=jsonschema.FormatChecker())
    # Nothing undocumented either: every key the endpoint sends is a documented property.
    page_schema = _resolved(documented, documented)
    assert set(page) == set(page_schema["properties"])
    line_schema = _resolved(documented, page_schema["properties"]["lines"]["items"])
    assert all(set(line) == set(line_schema["properties"]) for line in page["lines"])


def test_another_tenants_job_is_404_everywhere(member_api, other_world):
    theirs = launch(token_client(other_world.member, other_world.tenant), name="theirs")
    set_status(theirs["id"], JobStatus.CANCELLED)
    url = job_url(theirs["id"])
    for response in (
        member_api.get(url),
        member_api.get(f"{url}/events"),
        member_api.get(f"{url}/logs"),
        member_api.post(f"{url}/cancel"),
        member_api.post(f"{url}/clone"),
        member_api.delete(url),
    ):
        assert response.status_code == 404, response.content
    assert Job.objects.count() == 1


def test_viewer_can_read_but_not_launch_or_act(member_api, world):
    job = launch(member_api)
    viewer = token_client(world.viewer, world.tenant)
    assert viewer.get(JOBS).status_code == 200
    assert viewer.get(job_url(job["id"])).status_code == 200
    assert viewer.post(JOBS, body(), format="json").status_code == 403
    for action in ("pause", "resume", "cancel", "clone"):
        assert viewer.post(job_url(job["id"], action)).status_code == 403
    assert viewer.delete(job_url(job["id"])).status_code == 403
    assert Job.objects.count() == 1


def test_events_are_the_timeline_in_order(member_api, world):
    job = launch(member_api)
    set_status(job["id"], JobStatus.RUNNING, JobStatus.SUCCEEDED)
    response = member_api.get(job_url(job["id"], "events"))
    assert response.status_code == 200
    events = response.json()["results"]
    assert [(e["from_status"], e["to_status"]) for e in events] == [
        ("queued", "queued"),
        ("queued", "dispatching"),
        ("dispatching", "running"),
        ("running", "succeeded"),
    ]
    assert [e["actor"] for e in events] == [world.member.email, "system", "backend", "backend"]
    assert [e["actor_kind"] for e in events] == ["user", "system", "backend", "backend"]
    assert [e["reason"] for e in events] == ["submitted", "admitted", "running", "succeeded"]
    assert all(set(e) >= {"at", "from_status", "to_status", "actor", "reason"} for e in events)
    assert [e["at"] for e in events] == sorted(e["at"] for e in events)


# --- actions (state only; nothing runs) ---------------------------------------------------------


def test_actions_are_idempotent_and_illegal_ones_are_409(member_api):
    job = launch(member_api)
    url = job_url(job["id"])
    set_status(job["id"], JobStatus.RUNNING)

    paused = member_api.post(f"{url}/pause")
    assert paused.status_code == 200 and paused.json()["status"] == JobStatus.PAUSING
    assert member_api.post(f"{url}/pause").json()["status"] == JobStatus.PAUSING  # no-op
    set_status(job["id"], JobStatus.PAUSED)
    assert member_api.post(f"{url}/pause").status_code == 200

    resumed = member_api.post(f"{url}/resume")
    assert resumed.status_code == 200 and resumed.json()["status"] == JobStatus.RESUMING
    assert member_api.post(f"{url}/resume").status_code == 200
    set_status(job["id"], JobStatus.RUNNING)
    assert member_api.post(f"{url}/resume").json()["status"] == JobStatus.RUNNING

    # A running job is cancelling (billed, holding its compute) until its work ends.
    cancelled = member_api.post(f"{url}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == JobStatus.CANCELLING
    again = member_api.post(f"{url}/cancel")
    assert again.status_code == 200 and again.json()["status"] == JobStatus.CANCELLING
    events = Job.objects.get(pk=job["id"]).events.count()

    for action in ("pause", "resume"):
        refused = member_api.post(f"{url}/{action}")
        assert refused.status_code == CONFLICT, refused.content
        assert "cancelling" in refused.json()["detail"]
    assert member_api.delete(url).status_code == CONFLICT  # not finished yet
    assert Job.objects.get(pk=job["id"]).events.count() == events
    set_status(job["id"], JobStatus.CANCELLED)  # the backend reported the work gone
    assert member_api.post(f"{url}/cancel").json()["status"] == JobStatus.CANCELLED


def test_resuming_or_cancelling_a_succeeded_job_is_409(member_api):
    job = launch(member_api)
    set_status(job["id"], JobStatus.RUNNING, JobStatus.SUCCEEDED)
    for action in ("resume", "cancel", "pause"):
        refused = member_api.post(job_url(job["id"], action))
        assert refused.status_code == CONFLICT
        assert refused.json()["detail"]
    assert Job.objects.get(pk=job["id"]).status == JobStatus.SUCCEEDED


def test_pausing_a_queued_job_is_409_and_cancelling_it_works(member_api):
    launch(member_api, name="filler", cpus=local_cpu_pool().allocatable_vcpus)
    queued = launch(member_api, name="queued")
    assert member_api.post(job_url(queued["id"], "pause")).status_code == CONFLICT
    cancelled = member_api.post(job_url(queued["id"], "cancel"))
    assert cancelled.status_code == 200 and cancelled.json()["status"] == JobStatus.CANCELLED


def test_delete_only_a_finished_job(member_api):
    job = launch(member_api)
    url = job_url(job["id"])
    refused = member_api.delete(url)
    assert refused.status_code == CONFLICT and refused.json()["detail"]
    assert Job.objects.filter(pk=job["id"]).exists()

    member_api.post(f"{url}/cancel")
    assert member_api.delete(url).status_code == 204
    assert member_api.get(url).status_code == 404
    assert member_api.delete(url).status_code == 404


def test_clone_is_a_new_job_with_the_same_spec(member_api):
    job = launch(member_api, env={"A": "1"}, secret_env={"TOKEN": "s3cret"}, labels={"k": "v"})
    set_status(job["id"], JobStatus.RUNNING, JobStatus.FAILED)
    response = member_api.post(job_url(job["id"], "clone"))
    assert response.status_code == 201
    clone = response.json()
    assert clone["id"] != job["id"]
    assert clone["name"] == "api job (clone)"
    assert clone["status"] in (JobStatus.DISPATCHING, JobStatus.QUEUED)
    for key in ("image", "command", "env", "secret_env", "labels", "cpus", "priority"):
        assert clone[key] == job[key], key
    assert decrypt_json(Job.objects.get(pk=clone["id"]).secret_env_encrypted) == {"TOKEN": "s3cret"}


# --- query counts ----------------------------------------------------------------------------


def test_list_query_count_does_not_grow_with_jobs(member_api, world, django_assert_max_num_queries):
    def add_jobs(count: int) -> None:
        for n in range(count):
            launch(member_api, name=f"bulk {n}")

    # Running and queued jobs from the start: each kind may cost its own (single) query.
    launch(member_api, name="filler", cpus=local_cpu_pool().allocatable_vcpus - 1)
    add_jobs(2)
    # A running job's cost is priced live (a query of its own): running ones from the start.
    running = launch(member_api, name="running")
    advance_to(Job.objects.get(pk=running["id"]), JobStatus.RUNNING)
    member_api.get(JOBS)  # warm-up: the token's first use writes its last use
    with CaptureQueriesContext(connection) as few:
        assert member_api.get(JOBS).status_code == 200
    few_jobs_queries = len(few)  # now: later requests reset the connection's query log
    add_jobs(30)
    for job in Job.objects.filter(name__in=[f"bulk {n}" for n in range(0, 30, 3)]):
        advance_to(job, JobStatus.RUNNING)
    with django_assert_max_num_queries(few_jobs_queries):
        response = member_api.get(JOBS)
    statuses = [job["status"] for job in response.json()["results"]]
    assert len(statuses) == 34
    assert statuses.count(JobStatus.RUNNING) >= 11 and statuses.count(JobStatus.QUEUED) >= 19


# --- lifecycle with real processes --------------------------------------------------------------


def observe_until(job_id: int, statuses: set[str], timeout: float = 15) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        services.jobs_observe(backend_name="local")
        job = Job.objects.get(pk=job_id)
        if job.status in statuses:
            return job
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} stayed {job.status} ({job.status_reason})")


def wait_for_line(api, url: str, text: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in [line["text"] for line in api.get(f"{url}/logs").json()["lines"]]:
            return
        time.sleep(0.05)
    raise AssertionError(f"no line {text!r} in the job's output")


def dispatch(job_id: int) -> Job:
    """What the dispatch sweep does for the job in the worker."""
    return services.job_dispatch(job=Job.objects.get(pk=job_id))


@pytest.mark.django_db(transaction=True)
def test_logs_page_by_line_number(member_api):
    program = "for i in range(1, 6): print(f'line {i}')"
    job = launch(member_api, command=["python", "-c", program])
    assert dispatch(job["id"]).status == JobStatus.RUNNING
    observe_until(job["id"], {JobStatus.SUCCEEDED, JobStatus.FAILED})
    url = job_url(job["id"], "logs")

    first = member_api.get(url, {"since_line": 0, "limit": 2}).json()
    assert all(line.pop("ts") for line in first["lines"])  # when the server read it
    assert first == {
        "lines": [
            {"line_no": 1, "rank": 0, "text": "line 1"},
            {"line_no": 2, "rank": 0, "text": "line 2"},
        ],
        "next_line": 2,
    }
    rest = member_api.get(url, {"since_line": first["next_line"]}).json()
    assert [line["text"] for line in rest["lines"]] == ["line 3", "line 4", "line 5"]
    assert rest["next_line"] == 5
    assert member_api.get(url, {"since_line": 5}).json() == {"lines": [], "next_line": 5}
    assert member_api.get(url, {"since_line": "x"}).status_code == 400

    finished = member_api.get(job_url(job["id"])).json()
    assert (finished["status"], finished["exit_code"]) == (JobStatus.SUCCEEDED, 0)
    assert COST.match(finished["cost_to_date"])
    refused = member_api.post(job_url(job["id"], "resume"))
    assert refused.status_code == CONFLICT and "succeeded" in refused.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_pause_resume_cancel_a_running_job(member_api, settings):
    settings.JOB_TERMINATION_GRACE_SECONDS = 1
    program = (
        "import os, signal, sys, time\n"
        "print('resumed' if os.environ['GPUGEEK_RESUMED'] == '1' else 'fresh', flush=True)\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        "time.sleep(60)\n"
    )
    job = launch(member_api, command=["python", "-c", program])
    url, backend = job_url(job["id"]), LocalBackend()
    dispatch(job["id"])
    observe_until(job["id"], {JobStatus.RUNNING})
    try:
        wait_for_line(member_api, url, "fresh")  # started for real (slow on a busy machine)
        assert member_api.post(f"{url}/pause").json()["status"] == JobStatus.PAUSING
        backend.suspend(Job.objects.get(pk=job["id"]))  # job_suspend_task
        observe_until(job["id"], {JobStatus.PAUSED})
        assert member_api.post(f"{url}/pause").json()["status"] == JobStatus.PAUSED

        assert member_api.post(f"{url}/resume").json()["status"] == JobStatus.RESUMING
        services.job_backend_resume(job=Job.objects.get(pk=job["id"]))  # job_resume_task
        assert member_api.get(url).json()["status"] == JobStatus.RUNNING
        wait_for_line(member_api, url, "resumed")
    finally:
        cancelled = member_api.post(f"{url}/cancel")
        backend.cancel(Job.objects.get(pk=job["id"]))  # job_cancel_task
    assert cancelled.status_code == 200 and cancelled.json()["status"] == JobStatus.CANCELLING
    observe_until(job["id"], {JobStatus.CANCELLED})
    texts = [line["text"] for line in member_api.get(f"{url}/logs").json()["lines"]]
    assert texts[:2] == ["fresh", "resumed"]
    events = [e["to_status"] for e in member_api.get(f"{url}/events").json()["results"]]
    assert events[1:] == [
        "dispatching",
        "running",
        "pausing",
        "paused",
        "resuming",
        "resuming",  # the note of where it resumed from (no checkpoint: the beginning)
        "running",
        "cancelling",
        "cancelled",
    ]
