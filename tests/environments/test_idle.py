"""The idle rule: a pure function over activity series on a fake clock (stop within the
idle time + 30 s of the last activity, never while any source is active or can't be
read), the readings it takes from the database, and the steps the console takes (warn
with a banner and a notification, "Keep running", stop keeping the volume), each on the
job's timeline with the readings. The end-to-end idle stop of a real sshd is in
test_ssh.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from console.models import Notification
from console.services.ssh_keys import ssh_key_add
from environments import selectors, services
from environments.idle_rule import Activity, IdleStep, idle_decide, last_busy_at
from environments.models import Environment, EnvironmentStatus
from jobs.models import JobEvent, JobMetricSample, JobStatus
from storage.models import Volume
from tests.conftest import signed_in_client, token_client
from tests.factories import ed25519_public_key_line

T0 = datetime(2026, 12, 5, 9, 0, tzinfo=UTC)
TICK = timedelta(seconds=10)  # the beat pass's period


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def simulate(series: dict[str, list[datetime]], *, idle=60, warning=10, until=minutes(240)):
    """Run the rule every TICK from T0 with sources active at the given moments (each
    source's last activity is its latest moment so far, else T0): the first warning's
    and the stop's times."""
    warned = None
    now = T0
    while now <= T0 + until:
        activities = [
            Activity(name, max([T0, *(at for at in moments if at <= now)]), name)
            for name, moments in series.items()
        ]
        decision = idle_decide(activities, idle_minutes=idle, warning_minutes=warning, now=now)
        if decision.step is IdleStep.WARN and warned is None:
            warned = now
        if decision.step is IdleStep.STOP:
            return warned, now
        if decision.step is IdleStep.ACTIVE:
            warned = None
        now += TICK
    return warned, None


def test_it_stops_within_idle_time_and_30_s_of_the_last_activity_of_any_source():
    ssh = [T0 + minutes(m) for m in range(10, 41)]  # a session open 10-40 min, beat a minute
    gpu = [T0 + minutes(m) for m in (5, 55, 70)]  # busy moments of a training run
    warned, stopped = simulate({"ssh": ssh, "gpu": gpu, "keep running": []})
    last = T0 + minutes(70)
    assert last + minutes(60) <= stopped <= last + minutes(60) + timedelta(seconds=30)
    assert stopped - warned == minutes(10)


def test_it_never_stops_while_a_source_is_active():
    busy_every_half_hour = [T0 + minutes(m) for m in range(0, 600, 30)]
    warned, stopped = simulate(
        {"ssh": [], "gpu": busy_every_half_hour}, idle=45, warning=5, until=minutes(590)
    )
    assert (warned, stopped) == (None, None)


def test_activity_during_the_warning_calls_the_stop_off():
    # Warned at 50 min; a connection at 55 min: no stop at 60, the count starts again.
    warned, stopped = simulate({"ssh": [T0 + minutes(55)]}, until=minutes(200))
    assert stopped == T0 + minutes(115)
    assert warned == T0 + minutes(105)


def test_a_source_that_cant_be_read_counts_as_active():
    quiet = Activity("ssh", T0, "none")
    unreadable = Activity("gpu", None, "no recent reading")
    decision = idle_decide([quiet, unreadable], idle_minutes=60, warning_minutes=10,
                           now=T0 + minutes(500))  # fmt: skip
    assert decision.step is IdleStep.ACTIVE
    assert "gpu: no recent reading" in decision.readings
    with pytest.raises(ValueError):
        idle_decide([], idle_minutes=60, warning_minutes=10, now=T0)


def test_gpu_readings_give_the_last_busy_moment_and_stale_ones_none():
    series = [(T0 + minutes(m), u) for m, u in ((1, 90.0), (2, 40.0), (3, 2.0), (4, 1.0))]
    assert last_busy_at(series, threshold=5, fresh_after=T0) == T0 + minutes(2)
    idle = [(at, 0.0) for at, _ in series]
    # Idle since the first reading, not since before the readings began.
    assert last_busy_at(idle, threshold=5, fresh_after=T0) == T0 + minutes(1)
    assert last_busy_at(series, threshold=5, fresh_after=T0 + minutes(5)) is None
    assert last_busy_at([], threshold=5, fresh_after=T0) is None


# --- in the console ---------------------------------------------------------------------------

API = "/api/v1/environments"


def notes(environment):
    return list(
        JobEvent.objects.filter(
            job=environment.current_job, from_status="running", to_status="running"
        ).values_list("reason", flat=True)
    )


def test_warning_keep_running_and_the_stop_each_go_on_the_timeline(running, world):
    api = token_client(world.member, world.tenant)
    decision = services.environment_idle_check(environment=running)
    assert decision.step is IdleStep.WARN
    body = api.get(f"{API}/box").json()
    assert body["status"] == EnvironmentStatus.IDLE_WARNING
    assert body["idle_stop_at"] is not None and "unless there is activity" in body["status_reason"]
    assert "ssh: no connection since the start" in notes(running)[-1]
    warning = Notification.objects.get(user=world.member)
    assert warning.level == "warning" and "stops at" in warning.title
    # The rule runs every 10 s: a warning is given once.
    services.environment_idle_check(environment=Environment.objects.get(pk=running.pk))
    assert Notification.objects.filter(user=world.member).count() == 1

    kept = api.post(f"{API}/box/keep-alive", {}, format="json")
    assert kept.status_code == 200, kept.content
    assert kept.json()["status"] == EnvironmentStatus.RUNNING
    assert kept.json()["idle_stop_at"] is None
    assert "active again" in notes(running)[-1]
    assert "keep running: asked until" in notes(running)[-1]

    later = timezone.now() + minutes(61)
    running = Environment.objects.select_related("tenant", "current_job", "created_by").get(
        pk=running.pk
    )
    assert services.environment_idle_check(environment=running, now=later).step is IdleStep.STOP
    running.refresh_from_db()
    job = running.current_job
    assert job.status in (JobStatus.CANCELLING, JobStatus.CANCELLED)
    stop = JobEvent.objects.filter(job=job, to_status=job.status).last()
    assert "stopped by its idle policy" in stop.reason and "keep running" in stop.reason
    assert Notification.objects.filter(user=world.member, title__contains="stopped").exists()
    assert Volume.objects.get(name="box-home").deleted_at is None


def test_an_open_ssh_connection_and_a_busy_gpu_are_activity(running):
    policy = services.idle_policy_validate(running.idle_policy)
    now = timezone.now()
    services.environment_ssh_activity(environment_id=running.pk)
    running.refresh_from_db()
    ssh = next(a for a in selectors.environment_activities(
        environment=running, policy=policy, now=now) if a.source == "ssh")  # fmt: skip
    assert ssh.last_active_at == running.last_activity_at
    assert services.environment_idle_check(environment=running).step is IdleStep.ACTIVE

    running.gpus_per_node = 1  # read as a GPU environment: its job's GPU readings count
    gpu = [a for a in selectors.environment_activities(environment=running, policy=policy,
                                                       now=now) if a.source == "gpu"]  # fmt: skip
    assert gpu[0].last_active_at is None  # no reading at all: can't tell, so active
    job = running.current_job
    for seconds, utilization in ((-120, 80.0), (-60, 1.0), (-10, 0.0)):
        JobMetricSample.objects.create(job=job, at=now + timedelta(seconds=seconds), node="n",
                                       gpu=0, utilization=utilization)  # fmt: skip
    gpu = [a for a in selectors.environment_activities(environment=running, policy=policy,
                                                       now=now) if a.source == "gpu"]  # fmt: skip
    assert gpu[0].last_active_at == now - timedelta(seconds=120)
    assert "above 5 %" in gpu[0].detail


def test_keep_alive_refusals_and_another_tenant_gets_404(running, world, other_world):
    api = token_client(world.member, world.tenant)
    assert api.post(f"{API}/box/keep-alive", {"minutes": -1}, format="json").status_code == 400
    assert api.post(f"{API}/box/keep-alive", {"minutes": 10**6}, format="json").status_code == 400
    theirs = token_client(other_world.owner, other_world.tenant)
    assert theirs.post(f"{API}/box/keep-alive", {}, format="json").status_code == 404
    until = api.post(f"{API}/box/keep-alive", {"minutes": 120}, format="json").json()
    assert until["keep_alive_until"] > (timezone.now() + minutes(119)).isoformat()
    api.post(f"{API}/box/stop")
    refused = api.post(f"{API}/box/keep-alive", {}, format="json")
    assert refused.status_code == 409 and "isn't running" in refused.json()["detail"]


def test_the_page_shows_the_warning_with_a_keep_running_button(running, world):
    services.environment_idle_check(environment=running)
    client = signed_in_client(world.member, world.tenant)
    page = client.get("/environments/box/")
    assert b'data-testid="idle-warning"' in page.content and b"Keep running" in page.content
    response = client.post("/environments/box/keep-alive/", follow=True)
    assert b"keeps running" in response.content
    assert b'data-testid="idle-warning"' not in response.content
    running.refresh_from_db()
    assert running.idle_stop_at is None


# --- deleted after a long stop, only where the policy says so ------------------------------


def stopped_environment(world, name: str, **policy) -> Environment:
    environment = services.environment_create(
        tenant=world.tenant, user=world.member, name=name, region="local",
        image="python-3.11", cpus=1, idle_policy=policy or None,
    )  # fmt: skip
    services.environment_start(environment=environment, user=world.member)
    services.environment_stop(environment=environment, user=world.member)  # cancelled at once
    return Environment.objects.get(pk=environment.pk)


def test_a_long_stopped_environment_goes_with_its_volume_a_day_after_its_creator_is_told(
    world, catalog
):
    ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    doomed = stopped_environment(world, "doomed", delete_after_stopped_days=3)
    kept = stopped_environment(world, "kept")  # the default policy never deletes
    delete_at = selectors.environment_deletion_at(doomed)
    assert delete_at is not None and selectors.environment_deletion_at(kept) is None
    api = token_client(world.member, world.tenant)
    assert api.get(f"{API}/doomed").json()["scheduled_deletion_at"] is not None
    assert api.get(f"{API}/kept").json()["scheduled_deletion_at"] is None

    assert services.environments_delete_long_stopped(now=delete_at - minutes(60 * 25)) == 0
    assert not Notification.objects.exists()
    # A day before: told (once), nothing deleted.
    for _ in range(2):
        assert services.environments_delete_long_stopped(now=delete_at - minutes(60 * 23)) == 0
    notice = Notification.objects.get(user=world.member)
    assert "is deleted on" in notice.title and "doomed-home" in notice.body
    assert services.environments_delete_long_stopped(now=delete_at + minutes(60 * 2)) == 1
    assert list(Environment.objects.values_list("name", flat=True)) == ["kept"]
    assert Volume.objects.get(name="doomed-home").deleted_at is not None
    assert Notification.objects.filter(title="Environment doomed deleted").exists()


def test_a_start_or_a_policy_change_keeps_it_and_a_late_notice_still_gives_a_day(world, catalog):
    ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    environment = stopped_environment(world, "box", delete_after_stopped_days=1)
    delete_at = selectors.environment_deletion_at(environment)
    # The pass first runs long after the date: told now, deleted a day later at the earliest.
    late = delete_at + minutes(60 * 24 * 5)
    assert services.environments_delete_long_stopped(now=late) == 0
    assert services.environments_delete_long_stopped(now=late + minutes(60)) == 0
    # Its policy changes: the notice is given anew for the new date.
    services.environment_update(
        environment=environment, user=world.member,
        changes={"idle_policy": {"delete_after_stopped_days": 30}},
    )  # fmt: skip
    assert Environment.objects.get(pk=environment.pk).deletion_noticed_at is None
    # Started: not stopped, so nothing to delete however long ago it was.
    services.environment_start(environment=environment, user=world.member)
    assert services.environments_delete_long_stopped(now=late + minutes(60 * 24 * 90)) == 0
    assert Environment.objects.filter(pk=environment.pk).exists()


def test_the_page_says_when_a_stopped_environment_is_deleted(world, catalog):
    ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    stopped_environment(world, "box", delete_after_stopped_days=7)
    page = signed_in_client(world.member, world.tenant).get("/environments/box/")
    assert b'data-testid="deletion-notice"' in page.content and b"box-home" in page.content
