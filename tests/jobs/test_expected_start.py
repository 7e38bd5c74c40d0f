"""A queue that explains itself: each queued job says why it waits and when it is
expected to start, each running job when it is expected to end, from its tenant's
history of similar runs (jobs.expectations), on the job page, the jobs list and the API."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from console.service_errors import ServiceError
from jobs import services
from jobs.actors import BUDGET
from jobs.expectations.selectors import job_expectations
from jobs.expectations.wording import BUDGET_WAIT, duration_words, waiting_because
from jobs.models import Job, JobStatus, LaunchTemplate, Priority, WaitKind
from jobs.services import JobSpec
from marketplace.models import NodePool, TenantQuota
from tests.conftest import signed_in_client, token_client
from tests.jobs_helpers import advance_to, submit

# A fixed instant: every reading below is taken "now".
NOW = timezone.now().replace(microsecond=0)


@pytest.fixture(autouse=True)
def _local(catalog, settings):
    settings.COMPUTE_BACKENDS = ["local"]


def pool_vcpus() -> int:
    return NodePool.objects.get(backend="local", gpu_type=None, tier="on_demand").allocatable_vcpus


def past_runs(world, minutes: list[int], **spec) -> None:
    """Succeeded runs of `minutes` each, ten days ago (through the state machine)."""
    for number, length in enumerate(minutes):
        job = submit(world, f"past {number}", **spec)
        started = NOW - timedelta(days=10, hours=number)
        advance_to(job, JobStatus.RUNNING, at=started)
        advance_to(job, JobStatus.SUCCEEDED, at=started + timedelta(minutes=length))


def running(world, name: str, *, since: timedelta, **spec) -> Job:
    return advance_to(submit(world, name, **spec), JobStatus.RUNNING, at=NOW - since)


def test_a_queued_job_starts_when_the_running_one_is_expected_to_end(world):
    past_runs(world, [30, 40, 50], project="llm")
    big = running(world, "big", since=timedelta(minutes=10), project="llm", cpus=pool_vcpus())
    waiting = submit(world, "next", project="llm", cpus=2)
    assert (waiting.status, waiting.wait_kind) == (JobStatus.QUEUED, WaitKind.CAPACITY)

    found = job_expectations([big, waiting], now=NOW)

    # The running job: its start of running plus the median of three similar runs.
    assert found[big.pk].expected_end == NOW + timedelta(minutes=30)
    assert found[big.pk].prediction.as_dict() == {
        "median_seconds": 2400,
        "p90_seconds": 3000,
        "samples": 3,
        "basis": "project",
    }
    assert "(in 30 min), based on 3 similar runs in the same project (median 40 min" in (
        found[big.pk].sentence
    )
    # The queued one: when the GPUs... the vCPUs free up, then for its own predicted time.
    assert found[waiting.pk].expected_start == NOW + timedelta(minutes=30)
    assert found[waiting.pk].expected_end == NOW + timedelta(minutes=70)
    sentence = found[waiting.pk].sentence
    assert sentence.startswith("expected to start ~") and "(in 30 min), because waiting" in sentence


def test_without_history_the_max_runtime_is_the_estimate(world):
    holder = running(
        world, "long", since=timedelta(minutes=30), cpus=pool_vcpus(), max_runtime_minutes=120
    )
    waiting = submit(world, "short", cpus=1, max_runtime_minutes=60)

    found = job_expectations([holder, waiting], now=NOW)

    assert found[waiting.pk].expected_start == NOW + timedelta(minutes=90)
    assert found[waiting.pk].prediction.basis == "max_runtime"
    assert "based on its maximum runtime (2 h)" in found[holder.pk].sentence


def test_an_overdue_job_is_expected_to_end_now(world):
    past_runs(world, [10, 10, 10])
    late = running(world, "late", since=timedelta(hours=2), cpus=pool_vcpus())
    assert job_expectations([late], now=NOW)[late.pk].expected_end == NOW


def test_jobs_ahead_take_the_capacity_first_in_queue_order(world):
    holder = running(world, "holder", since=timedelta(0), cpus=pool_vcpus(), max_runtime_minutes=10)
    first = submit(world, "first", cpus=pool_vcpus(), max_runtime_minutes=20)
    second = submit(world, "second", cpus=1, max_runtime_minutes=5)

    found = job_expectations([holder, first, second], now=NOW)

    assert found[first.pk].expected_start == NOW + timedelta(minutes=10)
    # Not before the first one, though one vCPU is free beside it: no overtaking.
    assert found[second.pk].expected_start == NOW + timedelta(minutes=30)
    assert found[second.pk].because == "1 job is ahead of it for the same pool"


def test_higher_priority_jobs_ahead_are_named(world):
    # A critical holder: the critical job behind it can't preempt it, so it waits too.
    running(
        world, "holder", since=timedelta(0), cpus=pool_vcpus(), max_runtime_minutes=10,
        priority=Priority.CRITICAL,
    )  # fmt: skip
    submit(world, "normal", cpus=1)
    submit(world, "urgent", cpus=1, priority=Priority.CRITICAL)
    last = submit(world, "last", cpus=1)
    assert last.wait_kind == WaitKind.POOL_QUEUE

    because = job_expectations([last], now=NOW)[last.pk].because

    assert because == "2 jobs are ahead of it for the same pool (1 of higher priority)"


def test_a_quota_wait_says_so_and_ends_when_the_tenants_job_does(world):
    TenantQuota.objects.update_or_create(
        tenant=world.tenant, gpu_type=None, defaults={"max_concurrent_jobs": 1, "max_gpus": None}
    )
    running(world, "holder", since=timedelta(0), cpus=1, max_runtime_minutes=15)
    waiting = submit(world, "waiting", cpus=1)
    assert waiting.wait_kind == WaitKind.QUOTA

    found = job_expectations([waiting], now=NOW)[waiting.pk]

    assert found.expected_start == NOW + timedelta(minutes=15)
    assert (
        found.because
        == "your organisation's quota (at most 1 jobs at once) is taken by its other jobs"
    )


def test_a_job_bigger_than_its_pool_gets_no_start(world):
    running(world, "holder", since=timedelta(0), cpus=pool_vcpus())
    waiting = submit(world, "waiting", cpus=1)
    # A capacity sync finds the pool's nodes gone.
    NodePool.objects.filter(backend="local", gpu_type=None, tier="on_demand").update(
        allocatable_vcpus=0
    )

    found = job_expectations([waiting], now=NOW)[waiting.pk]

    assert (found.expected_start, found.expected_end) == (None, None)
    assert found.sentence.startswith("no start can be foreseen yet, because")


@pytest.mark.parametrize(
    "kind, reason, ahead, higher, words",
    [
        (
            WaitKind.CAPACITY,
            "waiting for 8 GPUs in h100 (2 free)",
            0,
            0,
            "waiting for 8 GPUs in h100 (2 free)",
        ),
        (
            WaitKind.POOL_QUEUE,
            "",
            3,
            2,
            "3 jobs are ahead of it for the same pool (2 of higher priority)",
        ),
        (
            WaitKind.QUOTA,
            "quota: 6 of 8 GPUs in use",
            0,
            0,
            "your organisation's quota (6 of 8 GPUs in use) is taken by its other jobs",
        ),
        (WaitKind.QUOTA_QUEUE, "", 1, 0, "your organisation's quota is taken by its other jobs"),
        (
            WaitKind.SUSPENDED,
            "",
            0,
            0,
            "your organisation is suspended (its jobs start once it is reactivated)",
        ),
        (WaitKind.ADMISSION, "waiting for admission", 0, 0, "it is waiting for admission"),
        (
            WaitKind.TOPOLOGY,
            "needs 6 nodes inside one block of h100 (zone); the most free in one block is 4 (b)",
            0,
            0,
            "needs 6 nodes inside one block of h100 (zone); the most free in one block is 4 (b)",
        ),
    ],
)
def test_every_wait_is_worded_for_people(kind, reason, ahead, higher, words):
    job = Job(wait_kind=kind, status_reason=reason)
    assert waiting_because(job, ahead, higher) == words


def test_durations_read_naturally():
    assert [duration_words(s) for s in (20, 35 * 60, 125 * 60, 26 * 3600)] == [
        "under a minute",
        "35 min",
        "2 h 5 min",
        "1 d 2 h",
    ]


def test_a_page_of_jobs_costs_the_same_queries_as_a_few(world, other_world):
    past_runs(world, [5, 6, 7], project="a")
    running(world, "r0", since=timedelta(0), cpus=pool_vcpus() - 1)
    jobs = [submit(world, f"q{n}", cpus=2, project="a") for n in range(2)]
    with CaptureQueriesContext(connection) as few:
        job_expectations(list(Job.objects.filter(pk__in=[j.pk for j in jobs])), now=NOW)
    for n in range(12):
        submit(world, f"more {n}", cpus=2, project=f"p{n % 4}")
        submit(other_world, f"theirs {n}", cpus=1, project="a")
    many = list(Job.objects.exclude(status=JobStatus.SUCCEEDED))
    with CaptureQueriesContext(connection) as lots:
        found = job_expectations(many, now=NOW)
    assert len(lots) <= len(few)
    assert all(found[job.pk].sentence for job in many)


def test_the_api_gives_expected_start_end_and_the_prediction(world, other_world):
    api = token_client(world.member, world.tenant)
    running(world, "holder", since=timedelta(0), cpus=pool_vcpus(), max_runtime_minutes=10)
    waiting = submit(world, "waiting", cpus=1, max_runtime_minutes=30)

    asked = timezone.now()
    answer = api.get(f"/api/v1/jobs/{waiting.pk}").json()
    listed = {row["id"]: row for row in api.get("/api/v1/jobs").json()["results"]}
    between = timezone.now() - asked  # (an estimate counts from now: it moves meanwhile)

    assert answer["expected_start"] is not None and answer["expected_end"] is not None
    assert answer["runtime_prediction"] == {
        "median_seconds": 1800,
        "p90_seconds": 1800,
        "samples": 0,
        "basis": "max_runtime",
    }
    in_list = datetime.fromisoformat(listed[waiting.pk]["expected_start"])
    alone = datetime.fromisoformat(answer["expected_start"])
    assert timedelta(0) <= in_list - alone <= between  # the same estimate, read later
    finished = submit(world, "done", cpus=1)
    advance_to(finished, JobStatus.CANCELLED)
    done = api.get(f"/api/v1/jobs/{finished.pk}").json()
    assert (done["expected_start"], done["expected_end"], done["runtime_prediction"]) == (
        None,
        None,
        None,
    )
    theirs = token_client(other_world.member, other_world.tenant)
    assert theirs.get(f"/api/v1/jobs/{waiting.pk}").status_code == 404


def test_the_job_page_and_the_list_say_when(world, other_world):
    client = signed_in_client(world.member, world.tenant)
    past_runs(world, [40, 42, 44, 45] * 3, project="llm")
    holder = running(world, "holder", since=timedelta(0), cpus=pool_vcpus(), project="llm")
    waiting = submit(world, "waiting", cpus=1, project="llm")

    page = client.get(reverse("jobs:detail", args=[waiting.pk])).content.decode()
    running_page = client.get(reverse("jobs:detail", args=[holder.pk])).content.decode()
    listing = client.get(reverse("jobs:list")).content.decode()

    assert "Expected to start ~" in page and "because waiting for 1 vCPUs" in page
    assert "based on 12 similar runs in the same project (median 43 min" in running_page
    assert listing.count('data-testid="job-expected"') == 2 and "starts ~" in listing
    theirs = signed_in_client(other_world.member, other_world.tenant)
    assert theirs.get(reverse("jobs:detail", args=[waiting.pk])).status_code == 404


def test_a_launch_from_a_template_records_it_and_its_runs_predict(world, other_world):
    spec = {"image": "python-3.11", "command": ["python", "-c", "pass"], "cpus": 1}
    template = services.launch_template_save(
        job=submit(world, "seed", **spec), name="nightly", user=world.member
    )
    for number, length in enumerate([20, 22, 24]):
        job = services.job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=JobSpec(name=f"night {number}", project=f"n{number}", **spec),
            launch_template=template,
        )
        advance_to(job, JobStatus.RUNNING, at=NOW - timedelta(days=1))
        advance_to(job, JobStatus.SUCCEEDED, at=NOW - timedelta(days=1, minutes=-length))
    client = signed_in_client(world.member, world.tenant)
    response = client.post(
        f"{reverse('jobs:launch')}?template={template.pk}",
        {
            "name": "tonight", "project": "new", "gpu_type": "", "gpus_per_node": "0",
            "cpus": "1", "nodes": "1", "region": "local", "spot_ratio": "0",
            "image": "python-3.11", "command": "python -c 'print(1)'", "priority": "normal",
            "max_runtime_minutes": "60", "auto_release": "on",
        },
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    tonight = Job.objects.get(name="tonight")
    assert tonight.launch_template == template
    prediction = job_expectations([tonight], now=NOW)[tonight.pk].prediction
    assert (prediction.basis, prediction.median_seconds) == ("launch_template", 22 * 60)
    clone = services.job_clone(job=tonight, user=world.member)
    assert clone.launch_template == template
    # Another organisation's template is refused.
    theirs = LaunchTemplate.objects.create(tenant=other_world.tenant, name="x", spec={})
    with pytest.raises(ServiceError):
        services.job_submit(
            tenant=world.tenant,
            user=world.member,
            spec=JobSpec(name="sneaky", **spec),
            launch_template=theirs,
        )


def test_a_job_its_budget_paused_says_it_waits_for_the_budget(world):
    job = running(world, "spender", since=timedelta(minutes=5), cpus=1)
    services.job_pause_once(job=job, actor=BUDGET, reason="budget “GPU” used up")
    job = advance_to(job, JobStatus.PAUSED)
    client = signed_in_client(world.member, world.tenant)

    found = job_expectations([job], now=NOW)[job.pk]
    page = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()

    assert found.sentence == f"paused: {BUDGET_WAIT}"
    assert "resumes by itself when the budget is raised" in page
    assert "waits for its budget" in client.get(reverse("jobs:list")).content.decode()
