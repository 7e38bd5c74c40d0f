"""Autoscaling decisions between reconcile passes: beat asks every second, a decision
only moves the wanted count (from the gateway's counters in the test Redis), and a
changed count starts the service's reconcile pass at once."""

from __future__ import annotations

import time

import pytest

from console.celery import app as celery_app
from services import reconcile, services, tasks, traffic
from services.models import ScaleWindow, ServiceStatus
from tests.services.conftest import echo_spec, reconcile_until

pytestmark = pytest.mark.usefixtures("replicas_cleanup")


@pytest.fixture
def service(world, catalog):
    service = services.service_create(
        tenant=world.tenant,
        user=world.owner,
        spec=echo_spec(name="burst", min_replicas=1, max_replicas=4, scale_down_delay=300),
    )
    return reconcile_until(service, lambda s: s.status == ServiceStatus.READY)


def burst(service, in_flight: float) -> None:
    """The gateway's samples of the last three seconds: `in_flight` requests throughout."""
    end = traffic.tick_of(traffic.samples_end(time.time()))
    for tick in range(end - round(3 / traffic.TICK), end):
        busy = in_flight * traffic.TICK  # request-seconds in the tick
        traffic.traffic_record(tick=tick, taken={service.pk: (50, busy)})


def test_beat_asks_for_decisions_every_second(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["services-autoscale"]
    celery_app.loader.import_default_modules()
    assert entry["task"] in celery_app.tasks and entry["schedule"] == 1.0


def test_a_burst_between_passes_raises_the_wanted_count_and_starts_a_pass(service, monkeypatch):
    assert reconcile.services_autoscale_all() == []  # no traffic: nothing to change
    # 30 in flight for the 3 s since a quiet window (a burst: averaged over its own 3 s,
    # not the 6 s panic window), three times what one replica takes (target 10): a panic,
    # at once.
    burst(service, in_flight=30.0)
    queued = []
    monkeypatch.setattr(tasks, "enqueue_now", lambda task, *args: queued.append((task, args)))
    tasks.services_autoscale_task()
    service.refresh_from_db()
    assert service.desired_replicas == 3 and service.panic_until is not None
    assert queued == [(tasks.service_reconcile_task, (service.pk,))]
    event = service.scale_events.order_by("-at", "-pk").first()
    assert (event.from_replicas, event.to_replicas, event.window) == (1, 3, ScaleWindow.PANIC)
    # The same traffic a second later: the count stands, no pass is asked for.
    assert reconcile.services_autoscale_all() == []
    # The pass it asked for starts the replicas.
    service = reconcile.service_reconcile(service_id=service.pk)
    assert service.replicas.count() == 3


def test_a_dip_is_remembered_between_passes_without_scaling_down(service):
    service.desired_replicas = 3
    service.save(update_fields=["desired_replicas"])
    assert reconcile.service_autoscale(service_id=service.pk) is False  # fewer wanted...
    service.refresh_from_db()
    assert service.desired_replicas == 3  # ...but not before scale_down_delay
    assert service.scale_down_wanted_since is not None


def test_a_service_paused_by_its_budget_is_left_alone(service):
    services.service_budget_pause(service=service, reason="Team cap is used up")
    burst(service, in_flight=60.0)
    assert reconcile.services_autoscale_all() == []
    service.refresh_from_db()
    assert service.desired_replicas == 1
