"""jobs.realtime: each payload built in one place and sent by the one sender, after
commit; billing's budget alerts and console's membership notices go through it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from console.models import Membership
from console.signals import membership_changed
from jobs import realtime
from jobs.models import JobStatus
from jobs.realtime import publish
from tests.jobs.test_consumers import make_job


@pytest.fixture
def sent(monkeypatch) -> list[tuple[list[str], dict]]:
    """What the publishers hand to the sender: (groups, payload) per send."""
    sends: list[tuple[list[str], dict]] = []
    monkeypatch.setattr(publish, "send_to_group", lambda g, p: sends.append(([g], dict(p))))
    monkeypatch.setattr(publish, "send_to_groups", lambda gs, p: sends.append((gs, dict(p))))
    monkeypatch.setattr(
        publish, "send_many", lambda batch: sends.extend((gs, dict(p)) for gs, p in batch)
    )
    return sends


def test_a_status_change_sends_what_a_socket_is_sent_at_connect(
    world, catalog, sent, django_capture_on_commit_callbacks
):
    job = make_job(world.tenant, status=JobStatus.QUEUED)
    with django_capture_on_commit_callbacks(execute=True):
        job = make_job(world.tenant, status=JobStatus.RUNNING)
    groups, payload = sent[-1]
    assert groups == [realtime.job_group(job.pk), realtime.tenant_group(world.tenant.pk)]
    job.refresh_from_db()
    assert payload == realtime.job_status_message(job)  # the consumer's message too
    assert payload["type"] == "status" and payload["status"] == "running"


def test_nothing_is_sent_before_commit(world, catalog, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        realtime.publish_job_status(make_job(world.tenant, status=JobStatus.QUEUED))
    assert sent == [] and callbacks


def test_a_budget_alert_goes_to_the_tenant_pages(world, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        realtime.publish_budget_alert(
            tenant_id=world.tenant.pk, budget="Research", amount=Decimal("500.00"),
            currency="EUR", threshold=100, kind="actual", spend=Decimal("512.346"),
        )  # fmt: skip
    [(groups, payload)] = sent
    assert groups == [realtime.tenant_group(world.tenant.pk)]
    assert payload["type"] == "alert" and payload["scope"] == "budget"
    assert payload["severity"] == "critical"
    assert payload["spend"] == "512.346" and payload["amount"] == "500.00"
    assert payload["message"] == (
        "Budget “Research” reached 100 % (spend 512.35 of 500.00 EUR this month)."
    )
    forecast = realtime.messages.budget_alert_message(
        budget="R", amount=Decimal(10), currency="EUR", threshold=80, kind="forecast",
        spend=Decimal(9),
    )  # fmt: skip
    assert forecast["severity"] == "warning" and "is forecast to reach 80 %" in forecast["message"]


def test_console_membership_notice_reaches_the_person_group(
    world, sent, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        membership_changed.send(sender=Membership, tenant_id=world.tenant.pk, user_id=7)
    assert sent == [
        (
            [realtime.membership_group(world.tenant.pk, 7)],
            {"type": realtime.MEMBERSHIP_CHANGED, "tenant_id": world.tenant.pk, "user_id": 7},
        )
    ]
