"""Replicas as sandboxed processes on this host, made to match the service by reconcile
passes: started, health-checked, restarted, rolled over to a new revision (never more
than max_replicas + 1 at once), scaled to zero, drained before they stop (waiting for the
requests the gateway counts on them), and a crash loop is "failed". Real processes (the
echo server), bounded waits."""

from __future__ import annotations

import time

import httpx
import pytest

from console.celery import app as celery_app
from jobs.backends import host_processes
from services import reconcile, scaling, services, traffic
from services.models import ReplicaState, ServiceStatus
from tests.services.conftest import echo_spec, ready_count, reconcile_until

pytestmark = pytest.mark.usefixtures("replicas_cleanup")


@pytest.fixture
def service(world, catalog):
    return services.service_create(
        tenant=world.tenant, user=world.owner, spec=echo_spec(env={"REPLICA_NAME": "r1"})
    )


def test_replicas_start_get_port_and_become_ready(service):
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    replicas = list(service.replicas.all())
    assert len(replicas) == 2 and {r.state for r in replicas} == {ReplicaState.READY}
    assert len({r.host_port for r in replicas}) == 2
    for replica in replicas:
        answer = httpx.get(f"http://127.0.0.1:{replica.host_port}/whoami", timeout=5).json()
        assert answer["replica"] == "r1"


def test_a_replica_not_ready_yet_is_not_marked_ready(world, catalog):
    slow = services.service_create(
        tenant=world.tenant,
        user=None,
        spec=echo_spec(name="slow", min_replicas=1, env={"READY_DELAY": "3"}),
    )
    slow = reconcile_until(slow, lambda s: s.replicas.exists())
    assert slow.status == ServiceStatus.DEPLOYING and ready_count(slow) == 0
    assert reconcile_until(slow, lambda s: s.status == ServiceStatus.READY)


def test_a_dead_replica_is_replaced(service):
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    victim = service.replicas.first()
    host_processes.host_stop(victim.handle)  # it dies, unasked
    service = reconcile_until(
        service,
        lambda s: ready_count(s) == 2 and not s.replicas.filter(pk=victim.pk).exists(),
    )
    assert service.restarts == 1


def test_a_new_revision_replaces_the_old_replicas_once_ready(service):
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    old = set(service.replicas.values_list("pk", flat=True))
    service = services.service_update(
        service=service, user=None, changes={"env": {"REPLICA_NAME": "r2"}}
    )
    service = reconcile_until(
        service,
        lambda s: (
            s.status == ServiceStatus.READY
            and not s.replicas.filter(pk__in=old).exists()
            and s.replicas.count() == 2
        ),
    )
    for replica in service.replicas.all():
        assert replica.revision.number == 2
        answer = httpx.get(f"http://127.0.0.1:{replica.host_port}/whoami", timeout=5).json()
        assert answer["replica"] == "r2"


def test_scale_to_zero_drains_then_stops(service):
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    handles = list(service.replicas.values_list("handle", flat=True))
    services.service_scale(service=service, user=None, min_replicas=0, max_replicas=2)
    first = reconcile.service_reconcile(service_id=service.pk)
    assert {r.state for r in first.replicas.all()} == {ReplicaState.DRAINING}
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.SCALED_TO_ZERO)
    assert not any(host_processes.host_running(handle) for handle in handles)


def test_a_crash_loop_is_failed_and_stops_restarting(world, catalog, settings):
    settings.SERVICE_MAX_RESTARTS = 2
    broken = services.service_create(
        tenant=world.tenant,
        user=None,
        spec=echo_spec(name="broken", min_replicas=1, command=["python3", "-c", "exit(3)"]),
    )
    broken = reconcile_until(broken, lambda s: s.status == ServiceStatus.FAILED)
    assert "exit code 3" in broken.status_reason
    assert not broken.replicas.exclude(state=ReplicaState.STOPPED).exists()
    reconcile.service_reconcile(service_id=broken.pk)
    assert not broken.replicas.exclude(state=ReplicaState.STOPPED).exists()


def test_deleting_a_service_stops_its_replicas(
    service, tasks_in_process, django_capture_on_commit_callbacks
):
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    handles = list(service.replicas.values_list("handle", flat=True))
    with django_capture_on_commit_callbacks(execute=True):
        services.service_delete(service=service, user=None)
    assert not any(host_processes.host_running(handle) for handle in handles)


def test_beat_reconciles_every_service_that_wants_or_has_replicas(service, world, settings):
    entry = settings.CELERY_BEAT_SCHEDULE["services-reconcile"]
    celery_app.loader.import_default_modules()
    assert entry["task"] in celery_app.tasks
    idle = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(name="idle", min_replicas=0)
    )
    assert reconcile.services_reconcile_all() == 1  # the idle one has nothing to do
    assert service.replicas.count() == 2 and not idle.replicas.exists()


def test_a_drained_replica_stops_only_once_its_requests_are_done(service):
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    for replica in service.replicas.all():  # a request in flight on each, as the gateway counts
        traffic.replicas_in_flight_add(changes={replica.pk: 1})
    services.service_scale(service=service, user=None, min_replicas=1, max_replicas=4)
    service = reconcile.service_reconcile(service_id=service.pk)
    draining = service.replicas.get(state=ReplicaState.DRAINING)
    assert service.replicas.filter(state=ReplicaState.READY).count() == 1
    time.sleep(scaling.DRAIN_MIN_SECONDS + 0.5)
    reconcile.service_reconcile(service_id=service.pk)
    draining.refresh_from_db()
    assert draining.state == ReplicaState.DRAINING  # still busy
    assert host_processes.host_running(draining.handle)
    traffic.replicas_in_flight_add(changes={draining.pk: -1})
    reconcile.service_reconcile(service_id=service.pk)
    draining.refresh_from_db()
    assert (draining.state, draining.reason) == (ReplicaState.STOPPED, "scaled down")
    assert not host_processes.host_running(draining.handle)
    event = service.scale_events.get()
    assert (event.from_replicas, event.to_replicas) == (2, 1)


def test_a_drain_that_never_ends_is_cut_after_its_timeout(service, monkeypatch):
    monkeypatch.setattr(scaling, "DRAIN_TIMEOUT_SECONDS", 3)
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    for replica in service.replicas.all():
        traffic.replicas_in_flight_add(changes={replica.pk: 1})  # and never finished
    services.service_scale(service=service, user=None, min_replicas=1, max_replicas=4)
    service = reconcile_until(service, lambda s: s.replicas.count() == 1, timeout=15)
    assert ready_count(service) == 1


def test_a_replica_wanted_again_while_draining_serves_again(service):
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    pks = set(service.replicas.values_list("pk", flat=True))
    for pk in pks:
        traffic.replicas_in_flight_add(changes={pk: 1})
    services.service_scale(service=service, user=None, min_replicas=1, max_replicas=4)
    reconcile.service_reconcile(service_id=service.pk)
    services.service_scale(service=service, user=None, min_replicas=2, max_replicas=4)
    service = reconcile.service_reconcile(service_id=service.pk)
    assert set(service.replicas.values_list("pk", flat=True)) == pks  # none new
    assert ready_count(service) == 2


def test_a_rollout_never_runs_more_than_max_replicas_plus_one(world, catalog):
    service = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(min_replicas=2, max_replicas=2)
    )
    service = reconcile_until(service, lambda s: s.status == ServiceStatus.READY)
    old = set(service.replicas.values_list("pk", flat=True))
    services.service_update(service=service, user=None, changes={"env": {"REPLICA_NAME": "r2"}})
    most = 0

    def done(fresh) -> bool:
        nonlocal most
        running = fresh.replicas.exclude(state=ReplicaState.STOPPED)
        most = max(most, running.count())
        # Never fewer ready than before, while the rollout runs.
        assert fresh.replicas.filter(state=ReplicaState.READY).count() >= 2 or not (
            fresh.replicas.filter(pk__in=old).exclude(state=ReplicaState.STOPPED).exists()
        )
        return not fresh.replicas.filter(pk__in=old).exists() and ready_count(fresh) == 2

    reconcile_until(service, done, timeout=60)
    assert most == 3


def test_beat_wakes_a_service_at_zero_with_a_request_waiting(world, catalog):
    idle = services.service_create(
        tenant=world.tenant, user=None, spec=echo_spec(name="idle", min_replicas=0)
    )
    assert reconcile.services_reconcile_all() == 0
    traffic.held_enter(service_id=idle.pk)  # the gateway holds one (its wake got lost)
    assert reconcile.services_reconcile_all() == 1
    idle.refresh_from_db()
    assert idle.desired_replicas == 1 and idle.replicas.count() == 1
    assert idle.scale_events.get().window == "cold_start"
