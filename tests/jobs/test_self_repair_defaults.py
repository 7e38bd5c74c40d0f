"""Self-repair choices per job with the organisation's defaults: a job that made no
choice follows its organisation's current default, its own choice wins, and with hardware
repair off a fault is alerted and its node marked suspect while the job keeps running.
The per-job endpoint answers both what was chosen and what is in effect."""

from __future__ import annotations

import pytest

from console.models import Notification
from jobs import alerts, repair
from jobs.alerts import SelfRepairChoices, self_repair_choices
from jobs.backends.base import GpuReading
from jobs.models import AlertKind, JobAlert, JobMonitor, JobStatus
from marketplace.models import SuspectNode
from tests.conftest import signed_in_client, token_client
from tests.jobs.test_alerts import NOW
from tests.jobs.test_consumers import make_job, write_log
from tests.jobs.test_self_repair import NOW as REPAIR_NOW
from tests.jobs.test_self_repair import readings_over
from tests.jobs_helpers import advance_to, submit

pytestmark = pytest.mark.django_db

EXPLODING = [f"step {n} loss={2.0 - n * 0.01:.3f}" for n in range(1, 21)] + ["loss=nan"]


def defaults(tenant, *, hardware_repair: bool, loss_explosion_pause: bool) -> None:
    tenant.hardware_repair_default = hardware_repair
    tenant.loss_explosion_pause_default = loss_explosion_pause
    tenant.save(update_fields=["hardware_repair_default", "loss_explosion_pause_default"])


def test_a_new_job_follows_its_organisations_current_defaults(world, catalog):
    job = make_job(world.tenant, gpus_per_node=1)
    assert self_repair_choices(job=job, monitor=None) == SelfRepairChoices(True, True)
    defaults(world.tenant, hardware_repair=False, loss_explosion_pause=False)
    job.refresh_from_db()
    # The rules' own bookkeeping row holds no choice: still the organisation's.
    monitor, _ = JobMonitor.objects.get_or_create(job=job)
    assert self_repair_choices(job=job, monitor=monitor) == SelfRepairChoices(False, False)


def test_the_jobs_own_choice_wins_over_the_default_either_way(world, catalog):
    defaults(world.tenant, hardware_repair=False, loss_explosion_pause=True)
    job = make_job(world.tenant, gpus_per_node=1)
    monitor = alerts.job_monitor_set(
        job=job,
        idle_auto_stop=False,
        idle_minutes=None,
        hardware_repair=True,
        loss_explosion_pause=False,
    )
    assert self_repair_choices(job=job, monitor=monitor) == SelfRepairChoices(True, False)
    # Left out, a choice stays; None gives it back to the organisation.
    monitor = alerts.job_monitor_set(job=job, idle_auto_stop=True, idle_minutes=5)
    assert (monitor.hardware_repair, monitor.loss_explosion_pause) == (True, False)
    monitor = alerts.job_monitor_set(
        job=job, idle_auto_stop=True, idle_minutes=5, hardware_repair=None
    )
    assert self_repair_choices(job=job, monitor=monitor) == SelfRepairChoices(False, False)


def test_a_loss_explosion_follows_the_default_unless_the_job_chose(world, catalog):
    defaults(world.tenant, hardware_repair=True, loss_explosion_pause=False)
    follows = make_job(world.tenant, name="follows", gpus_per_node=1, created_by=world.member)
    chose = make_job(world.tenant, name="chose", gpus_per_node=1, created_by=world.member)
    alerts.job_monitor_set(job=chose, idle_auto_stop=False, idle_minutes=None,
                           loss_explosion_pause=True)  # fmt: skip
    for job in (follows, chose):
        write_log(job, EXPLODING)
        [alert] = alerts.alerts_evaluate(job=job, now=NOW)
        assert alert.kind == AlertKind.LOSS_EXPLOSION
        job.refresh_from_db()
    assert follows.status == JobStatus.RUNNING
    assert "pausing" not in JobAlert.objects.get(job=follows).message
    assert chose.status == JobStatus.PAUSING


def stuck_gang(world):
    job = submit(
        world, "gang", gpu_type="h100-80gb", region="us-west", gpus_per_node=8, cpus=8, nodes=2
    )
    job = advance_to(job, JobStatus.RUNNING)
    samples = readings_over(job, 6, {"rank 0": 91.0, "rank 1": 0.0})
    readings = [
        GpuReading(node="rank 0", gpu=0, utilization=91.0, host="h100-a"),
        GpuReading(node="rank 1", gpu=0, utilization=0.0, host="h100-b"),
    ]
    return job, samples, readings


def test_with_hardware_repair_off_a_fault_alerts_and_marks_the_node_but_the_job_runs(
    world, catalog, settings, django_capture_on_commit_callbacks
):
    settings.COMPUTE_BACKENDS = ["kubernetes"]
    defaults(world.tenant, hardware_repair=False, loss_explosion_pause=True)
    job, samples, readings = stuck_gang(world)
    with django_capture_on_commit_callbacks():  # the cordon: no backend to call here
        alert = repair.job_stuck_rank(job=job, readings=readings, samples=samples, now=REPAIR_NOW)
    assert alert.severity == "critical"
    assert "Hardware repair is off for this job: it keeps running on h100-b" in alert.message
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.attempt == 1
    assert not job.events.filter(to_status=JobStatus.PREEMPTED).exists()
    assert list(SuspectNode.objects.values_list("name", flat=True)) == ["h100-b"]
    told = Notification.objects.get(user=world.member, title__contains="faulty node")
    assert told.title == "gang runs on a faulty node"

    # The job's own choice wins over the organisation's: a later fault moves it.
    alerts.job_monitor_set(job=job, idle_auto_stop=False, idle_minutes=None,
                           hardware_repair=True)  # fmt: skip
    JobAlert.objects.all().delete()  # past the cool-down
    with django_capture_on_commit_callbacks():
        repair.job_stuck_rank(job=job, readings=readings, samples=samples, now=REPAIR_NOW)
    job.refresh_from_db()
    assert job.attempt == 2
    assert job.events.filter(to_status=JobStatus.PREEMPTED).exists()


# --- the per-job endpoint ------------------------------------------------------------------------


def test_the_monitor_endpoint_sets_a_choice_or_gives_it_back_to_the_organisation(world, catalog):
    job = make_job(world.tenant, gpus_per_node=1, created_by=world.member)
    url = f"/api/v1/jobs/{job.pk}/monitor"
    api = token_client(world.member, world.tenant)
    fresh = api.get(url).json()
    assert fresh == {
        "idle_auto_stop": False,
        "idle_minutes": None,
        "loss_explosion_pause": None,
        "hardware_repair": None,
        "in_effect": {"loss_explosion_pause": True, "hardware_repair": True},
    }
    change = {"idle_auto_stop": False, "idle_minutes": None, "hardware_repair": False}
    answer = api.put(url, change, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["hardware_repair"] is False
    assert answer.json()["in_effect"] == {"loss_explosion_pause": True, "hardware_repair": False}
    # The organisation's default changes what an unchosen job does, not a chosen one.
    defaults(world.tenant, hardware_repair=True, loss_explosion_pause=False)
    assert api.get(url).json()["in_effect"] == {
        "loss_explosion_pause": False,
        "hardware_repair": False,
    }
    back = api.put(url, {**change, "hardware_repair": None}, format="json").json()
    assert back["hardware_repair"] is None and back["in_effect"]["hardware_repair"] is True
    refused = api.put(url, {**change, "hardware_repair": "yes"}, format="json")
    assert refused.status_code == 400, refused.content


# A viewer's PUT is refused by its role before any job is looked up (403, as on every job
# action: tests/jobs/test_job_permissions.py); those who may set choices get 404.
@pytest.mark.parametrize("role", ["owner", "member"])
def test_another_organisations_job_monitor_is_404(world, other_world, catalog, role):
    theirs = make_job(other_world.tenant, gpus_per_node=1, created_by=other_world.member)
    url = f"/api/v1/jobs/{theirs.pk}/monitor"
    change = {"idle_auto_stop": False, "idle_minutes": None, "hardware_repair": False}
    for client in (
        token_client(getattr(world, role), world.tenant),
        signed_in_client(getattr(world, role), world.tenant),
    ):
        assert client.get(url).status_code == 404
        put = client.put(url, change, content_type="application/json")
        assert put.status_code == 404, put.content
    assert not JobMonitor.objects.filter(job=theirs, hardware_repair=False).exists()
