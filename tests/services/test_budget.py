"""Budgets and services: a used-up budget scales the organisation's non-critical services
to zero (once, audited, on the page and in the API, the reconcile pass wanting no
replica), critical ones and project budgets leave them be, raising the budget brings
them back, a new non-critical service is refused meanwhile, and only owners and admins
may make a service critical. The gateway's 402 and the replicas' drain are tested end to
end in test_gateway.py."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.budgets.services import budget_create, budget_update, meter_and_enforce
from console.models import AuditEvent, Notification
from services import reconcile
from services.models import ScaleWindow, ServiceStatus
from tests.conftest import signed_in_client, token_client
from tests.services.test_metering import make_service, replica

pytestmark = pytest.mark.django_db

TINY = "0.000001"  # any usage uses it up


@pytest.fixture
def serving(world, catalog):
    """Two services of the organisation (one critical), each with a replica running for
    ten minutes in region local (CPU priced by the demo price book)."""
    since = timezone.now() - timedelta(minutes=10)
    local = catalog.region("local")
    api = make_service(world.tenant, local, name="api")
    api.min_replicas = api.desired_replicas = 2
    api.save(update_fields=["min_replicas", "desired_replicas"])
    critical = make_service(world.tenant, local, name="checkout")
    critical.priority = "critical"
    critical.save(update_fields=["priority"])
    for service in (api, critical):
        replica(service, started=since)
    return api, critical


def test_a_used_up_budget_pauses_non_critical_services_once(world, serving):
    api, critical = serving
    budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    meter_and_enforce(now=timezone.now())
    api.refresh_from_db()
    critical.refresh_from_db()
    assert api.paused_by_budget and api.status == ServiceStatus.PAUSED
    assert "Team cap" in api.status_reason and "100 %" in api.status_reason
    assert not critical.paused_by_budget and critical.status != ServiceStatus.PAUSED
    note = Notification.objects.get(user=world.owner, title="Budget “Team cap” reached 100 %")
    assert "Non-critical services are scaled to zero." in note.body
    for _ in range(2):  # later ticks don't pause or audit again
        meter_and_enforce(now=timezone.now())
    assert AuditEvent.objects.filter(action="service.paused_by_budget").count() == 1

    # The reconcile pass wants no replica (said once, as a budget decision) and starts none.
    paused = reconcile.service_reconcile(service_id=api.pk)
    assert paused.desired_replicas == 0 and paused.status == ServiceStatus.PAUSED
    assert not paused.replicas.exclude(state="stopped").exists()
    reconcile.service_reconcile(service_id=api.pk)
    (event,) = paused.scale_events.all()
    assert (event.from_replicas, event.to_replicas, event.window) == (2, 0, ScaleWindow.BUDGET)

    body = token_client(world.member, world.tenant).get(f"/api/v1/services/{api.pk}").json()
    assert (body["status"], body["priority"]) == ("paused", "normal")
    assert "Team cap" in body["status_reason"]
    page = signed_in_client(world.member, world.tenant).get(f"/services/{api.pk}/")
    assert b'data-testid="budget-paused"' in page.content and b"402" in page.content


def test_raising_the_budget_brings_the_service_back(world, serving):
    api, _ = serving
    budget = budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    meter_and_enforce(now=timezone.now())
    reconcile.service_reconcile(service_id=api.pk)
    budget_update(budget=budget, user=world.finance, amount="1000")
    api.refresh_from_db()
    assert not api.paused_by_budget and api.status != ServiceStatus.PAUSED
    assert api.status_reason == ""
    assert AuditEvent.objects.filter(action="service.resumed_by_budget").count() == 1
    # Its next pass wants min_replicas again (min 0 here, so none starts in this test).
    api.min_replicas = 0
    api.save(update_fields=["min_replicas"])
    assert reconcile.service_reconcile(service_id=api.pk).status != ServiceStatus.PAUSED


def test_a_project_budget_or_an_alert_only_budget_leaves_services_be(world, serving):
    api, _ = serving
    budget_create(
        tenant=world.tenant, user=world.owner, name="Vision", amount=TINY, project="vision"
    )
    budget_create(
        tenant=world.tenant, user=world.owner, name="Watch", amount=TINY, action="alert_only"
    )
    meter_and_enforce(now=timezone.now())
    api.refresh_from_db()
    assert not api.paused_by_budget


def test_only_owners_and_admins_make_a_service_critical(world, catalog):
    body = {
        "name": "echo", "image": "python:3.11-slim", "command": ["serve"], "port": 8080,
        "region": "local", "min_replicas": 0, "priority": "critical",
    }  # fmt: skip
    member = token_client(world.member, world.tenant)
    refused = member.post("/api/v1/services", body, format="json")
    assert refused.status_code == 403 and "owners and admins" in refused.json()["priority"][0]
    created = member.post("/api/v1/services", {**body, "priority": "low"}, format="json")
    assert created.status_code == 201 and created.json()["priority"] == "low"
    url = f"/api/v1/services/{created.json()['id']}"
    refused = member.patch(url, {"priority": "critical"}, format="json")
    assert refused.status_code == 403 and refused.json()["code"] == "forbidden"
    admin = token_client(world.admin, world.tenant)
    assert admin.patch(url, {"priority": "critical"}, format="json").json()["priority"] == (
        "critical"
    )
    bad = admin.patch(url, {"priority": "urgent"}, format="json")
    assert bad.status_code == 400 and "priority" in bad.json()


def test_a_used_up_budget_refuses_a_new_non_critical_service(world, serving):
    budget = budget_create(tenant=world.tenant, user=world.owner, name="Team cap", amount=TINY)
    meter_and_enforce(now=timezone.now())
    body = {
        "name": "another", "image": "python:3.11-slim", "command": ["serve"], "port": 8080,
        "region": "local", "min_replicas": 1,
    }  # fmt: skip
    member = token_client(world.member, world.tenant)
    refused = member.post("/api/v1/services", body, format="json")
    assert refused.status_code == 402 and refused.json()["code"] == "payment_required"
    assert "Team cap" in refused.json()["detail"]
    admin = token_client(world.admin, world.tenant)
    critical = admin.post("/api/v1/services", {**body, "priority": "critical"}, format="json")
    assert critical.status_code == 201
    budget_update(budget=budget, user=world.finance, amount="1000")
    again = member.post("/api/v1/services", {**body, "name": "later"}, format="json")
    assert again.status_code == 201
