"""Replicas as sandboxed processes on this host, made to match the service by reconcile
passes: started, health-checked, restarted, rolled over to a new revision, scaled to zero,
and a crash loop is "failed". Real processes (the echo server), bounded waits."""

from __future__ import annotations

import httpx
import pytest

from console.celery import app as celery_app
from jobs.backends import host_processes
from services import reconcile, services
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
