"""Demo history (`billing.demo_history`, run by `seed_demo`): past jobs exactly like
finished real ones, a ledger exactly what metering bills, and the invoices, budget and
Cost Explorer built from it."""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal
from io import StringIO
from itertools import pairwise
from unittest.mock import patch

import pytest
from django.core.management import call_command
from django.utils import timezone

from billing.demo_history import KEY_PREFIX, seed_demo_history
from billing.invoices.selectors import ledger_invoice_mismatches
from billing.invoices.services import (
    invoice_draft_delete,
    invoice_finalize,
    invoices_draft_monthly,
    previous_month,
)
from billing.metering.ledger import MICROSECONDS, SECONDS_QUANTUM, _tiers
from billing.metering.prices import PriceBook
from billing.metering.spans import JOB_COLUMNS, JobRow, StatusChange, billed_spans, split_span
from billing.models import (
    AMOUNT_QUANTUM,
    Bucket,
    Budget,
    BudgetAction,
    Invoice,
    InvoiceStatus,
    JobMeter,
    LiveUsageRollup,
    UsageDailyTotal,
    UsageRecord,
)
from console.models import AuditEvent, Tenant, User
from jobs.actors import Actor, ActorKind
from jobs.models import (
    BILL_OPENS,
    BILLED_STATUSES,
    FINISHED,
    HOLDING_COMPUTE,
    Job,
    JobEvent,
    JobStatus,
)
from jobs.state import can_transition, job_transition
from marketplace.models import PriceVersion, Tier
from marketplace.pricing import unit_prices
from tests.conftest import signed_in_client, token_client

ZERO = Decimal(0)


def seed(*options: str) -> str:
    out = StringIO()
    call_command("seed_demo", *options, stdout=out)
    return out.getvalue()


@pytest.fixture
def seeded(db) -> str:
    return seed()


def history_jobs():
    return Job.objects.filter(idempotency_key__startswith=KEY_PREFIX)


def total(values) -> Decimal:
    """Σ in Python: SQLite's SUM of decimals goes through floats."""
    return sum(values, ZERO)


def status_changes(job: Job) -> list[JobEvent]:
    return [e for e in job.events.all() if e.from_status != e.to_status]


def test_seeding_twice_creates_the_history_once(seeded):
    counts = Counter(history_jobs().values_list("tenant__slug", flat=True))
    assert set(counts) == {"acme", "globex"}
    assert all(80 <= n <= 150 for n in counts.values()), counts
    jobs = sum(counts.values())
    assert f"History: {jobs:,} past jobs, " in seeded
    assert "GPU-hours over 60 days." in seeded
    before = [m.objects.count() for m in (Job, JobEvent, AuditEvent, UsageRecord, Invoice, Budget)]

    again = seed()

    assert "History: seeded before; nothing added." in again
    after = [m.objects.count() for m in (Job, JobEvent, AuditEvent, UsageRecord, Invoice, Budget)]
    assert after == before


def test_every_job_finished_with_the_timeline_the_state_machine_writes(seeded):
    now = timezone.now()
    jobs = list(history_jobs().select_related("created_by", "pool", "spot_pool", "gpu_type"))
    for job in jobs:
        events = list(job.events.all())
        submitted = events[0]
        assert (submitted.from_status, submitted.to_status, submitted.reason) == (
            JobStatus.QUEUED,
            JobStatus.QUEUED,
            "submitted",
        )
        assert submitted.at == job.created_at and submitted.actor_user == job.created_by
        assert submitted.actor_kind == ActorKind.USER
        assert [e.at for e in events] == sorted(e.at for e in events)
        status, attempt, running_since, run_seconds = JobStatus.QUEUED, 1, None, 0.0
        for event in events[1:]:
            assert event.from_status == status and can_transition(status, event.to_status)
            if event.to_status == JobStatus.QUEUED:  # a requeue starts the next attempt
                assert status == JobStatus.PREEMPTED and event.attempt == attempt + 1
                attempt += 1
            assert event.attempt == attempt
            if status == JobStatus.RUNNING:
                run_seconds += (event.at - running_since).total_seconds()
            running_since = event.at if event.to_status == JobStatus.RUNNING else None
            status = event.to_status
        running = [e.at for e in events if e.to_status == JobStatus.RUNNING]
        assert job.status == status and job.status in FINISHED
        assert job.status_reason == events[-1].reason and job.wait_kind == ""
        assert job.finished_at == job.status_changed_at == events[-1].at < now
        assert job.started_at == (running[0] if running else None)
        assert job.attempt == attempt and job.running_since is None
        assert job.run_seconds == pytest.approx(run_seconds)
        assert job.exit_code == {JobStatus.SUCCEEDED: 0}.get(job.status, job.exit_code)
        assert job.labels == {"demo": "history"} and job.image.reference == job.image_reference
        assert job.nodes == job.on_demand_nodes + job.spot_nodes
        assert (job.pool is not None) == bool(job.on_demand_nodes)
        assert (job.spot_pool is not None) == bool(job.spot_nodes)
        for pool in (job.pool, job.spot_pool):
            if pool is not None:
                assert pool.gpu_type == job.gpu_type and pool.backend == job.backend
                assert pool.region_id == job.region_id
                assert job.gpus_per_node <= pool.gpus_per_node
        assert job.pool is None or job.pool.tier == Tier.ON_DEMAND
        assert job.spot_pool is None or job.spot_pool.tier == Tier.SPOT
    assert AuditEvent.objects.filter(action="job.launched").count() == len(jobs)

    # A realistic mix: mostly A100 and H100, every tier a launch can get, some
    # multi-node jobs, a few failures, cancels and spot preemptions that then succeeded.
    by_gpu = Counter(job.gpu_type.slug for job in jobs)
    assert sum(n for slug, n in by_gpu.items() if slug[:4] in ("a100", "h100")) > len(jobs) / 2
    assert len(by_gpu) >= 6
    assert any(job.spot_nodes and job.on_demand_nodes for job in jobs)
    assert any(job.spot_nodes and not job.on_demand_nodes for job in jobs)
    assert sum(job.nodes > 1 for job in jobs) >= 5
    statuses = Counter(job.status for job in jobs)
    assert statuses[JobStatus.SUCCEEDED] > 0.7 * len(jobs)
    assert statuses[JobStatus.FAILED] >= 3 and statuses[JobStatus.CANCELLED] >= 3
    requeued = [job for job in jobs if job.attempt > 1]
    assert len(requeued) >= 3 and all(job.status == JobStatus.SUCCEEDED for job in requeued)
    assert JobEvent.objects.filter(job__in=jobs, to_status=JobStatus.PAUSED).exists()
    durations = [(j.finished_at - j.started_at) for j in jobs if j.started_at]
    assert min(durations) < timedelta(hours=1) and max(durations) > timedelta(hours=30)


def test_no_pool_ever_holds_more_gpus_than_it_has(seeded):
    changes = defaultdict(list)  # pool → [(at, +/- GPUs)]
    for job in history_jobs().select_related("pool", "spot_pool"):
        held_since = None
        for event in status_changes(job):
            holds = event.to_status in HOLDING_COMPUTE
            if holds and held_since is None:
                held_since = event.at
            elif not holds and held_since is not None:
                for pool, nodes in (
                    (job.pool, job.on_demand_nodes),
                    (job.spot_pool, job.spot_nodes),
                ):
                    if pool is not None:
                        changes[pool].append((held_since, nodes * job.gpus_per_node))
                        changes[pool].append((event.at, -nodes * job.gpus_per_node))
                held_since = None
    assert changes
    for pool, deltas in changes.items():
        in_use = 0
        for _, delta in sorted(deltas, key=lambda d: (d[0], d[1])):  # frees before takes
            in_use += delta
            assert in_use <= pool.total_gpus, pool


def test_timelines_replay_through_the_state_machine(seeded):
    """One job of each kind of path, replayed on a copy through `job_transition` at its
    recorded instants: the same fields and the same events."""
    kinds = {}
    for job in history_jobs().order_by("pk"):
        kinds.setdefault(tuple(e.to_status for e in status_changes(job)), job)
    assert len(kinds) >= 5
    for job in kinds.values():
        copy = Job.objects.get(pk=job.pk)
        copy.pk = None
        copy.created_by = None  # tells no one
        copy.idempotency_key = ""
        copy.status, copy.status_reason, copy.wait_kind = (
            JobStatus.QUEUED,
            "waiting for admission",
            "admission",
        )
        copy.attempt, copy.started_at, copy.finished_at, copy.exit_code = 1, None, None, None
        copy.run_seconds, copy.running_since = 0.0, None
        copy.save()
        for event in status_changes(job):
            changes = {}
            if event.to_status == JobStatus.QUEUED:
                changes = {
                    "attempt": event.attempt,
                    "assigned_devices": [],
                    "wait_kind": "admission",
                }
            if (
                event.to_status in (JobStatus.SUCCEEDED, JobStatus.FAILED)
                and job.exit_code is not None
            ):
                changes = {"exit_code": job.exit_code}
            with patch("django.utils.timezone.now", return_value=event.at):
                job_transition(
                    job=copy,
                    to=event.to_status,
                    actor=Actor(ActorKind(event.actor_kind), event.actor, event.actor_user_id),
                    reason=event.reason,
                    **changes,
                )
        copy.refresh_from_db()
        fields = (
            "status",
            "status_reason",
            "wait_kind",
            "status_changed_at",
            "started_at",
            "finished_at",
            "run_seconds",
            "running_since",
            "attempt",
            "exit_code",
        )
        assert [getattr(copy, f) for f in fields] == [getattr(job, f) for f in fields]
        columns = (
            "at",
            "from_status",
            "to_status",
            "actor_kind",
            "actor_user_id",
            "reason",
            "attempt",
        )
        recorded = [tuple(getattr(e, c) for c in columns) for e in status_changes(job)]
        assert list(copy.events.values_list(*columns)) == recorded


def expected_records(job: Job, book: PriceBook, now: datetime) -> dict[tuple, tuple]:
    """What metering bills for a finished job, from its timeline and the price book in
    force, by metering's own rules (spans, hour and price-change cuts, tier shares)."""
    row = JobRow._make(Job.objects.filter(pk=job.pk).values_list(*JOB_COLUMNS).get())
    events = [StatusChange(e.at, e.to_status, e.attempt) for e in status_changes(job)]
    records = {}
    for span in billed_spans(events, job.created_at, now):
        for piece in split_span(span, book.change_points):
            for tier, units in _tiers(row):
                price = book.price(row, tier, piece.start)
                seconds = Decimal((piece.end - piece.start) // timedelta(microseconds=1))
                unit_seconds = (seconds / MICROSECONDS * units).quantize(SECONDS_QUANTUM)
                amount = (unit_seconds * price.unit_price / 3600).quantize(AMOUNT_QUANTUM)
                key = (piece.attempt, tier, piece.start)
                records[key] = (piece.end, units, unit_seconds, price.unit_price, amount)
    return records


def test_the_ledger_is_exactly_what_metering_bills(seeded):
    now = timezone.now()
    book = PriceBook()
    jobs = list(history_jobs().select_related("gpu_type"))
    for job in jobs:
        expected = expected_records(job, book, now)
        recorded = {
            (r.attempt, r.tier, r.interval_start): (
                r.interval_end, r.units, r.gpu_seconds, r.unit_price, r.amount
            )
            for r in UsageRecord.objects.filter(job=job)
        }  # fmt: skip
        assert recorded == expected, job
        # Σ billed seconds × GPUs, read off the timeline: from running, through pausing
        # or cancelling (a stop of a job that never ran pays nothing).
        billed, bill_open = 0.0, False
        changes = status_changes(job)
        for a, b in pairwise(changes):
            bill_open = a.to_status == BILL_OPENS or (bill_open and a.to_status in BILLED_STATUSES)
            if bill_open:
                billed += (b.at - a.at).total_seconds()
        gpu_seconds = total(v[2] for v in recorded.values())
        assert gpu_seconds == pytest.approx(Decimal(billed) * job.total_gpus, abs=Decimal("0.1"))
        meter = JobMeter.objects.filter(job=job).first()
        assert (meter is None) == (job.started_at is None)
        assert meter is None or (not meter.open and meter.metered_until >= job.finished_at)

    # Each record's price, found independently: the version in force at its start, its
    # tier's price (reserved never appears: launches don't place nodes there).
    versions = {}
    for record in UsageRecord.objects.filter(job__in=jobs).select_related("gpu_type"):
        version = PriceVersion.objects.in_force(record.interval_start)
        assert record.price_version_id == version.pk and record.note == ""
        entry = versions.setdefault(
            (version.pk, record.gpu_type_id, record.region_id),
            version.entries.get(gpu_type_id=record.gpu_type_id, region_id=record.region_id),
        )
        price = unit_prices(entry, version).for_tier(record.tier).quantize(AMOUNT_QUANTUM)
        assert record.unit_price == price and record.tier in (Tier.ON_DEMAND, Tier.SPOT)
        assert record.amount == (record.gpu_seconds * price / 3600).quantize(AMOUNT_QUANTUM)

    # The rollups and daily totals readers use hold the same money.
    for tenant in Tenant.objects.filter(slug__in=["acme", "globex"]):
        ledger = total(UsageRecord.objects.for_tenant(tenant).values_list("amount", flat=True))
        daily = total(UsageDailyTotal.objects.for_tenant(tenant).values_list("amount", flat=True))
        rollups = LiveUsageRollup.objects.for_tenant(tenant).filter(bucket=Bucket.DAY)
        assert ledger == daily == total(rollups.values_list("amount", flat=True)) > 0


def test_last_months_draft_builds_from_the_ledger_and_nothing_mismatches(seeded):
    now = timezone.now()
    start, end = previous_month(now)
    for tenant in Tenant.objects.filter(slug__in=["acme", "globex"]):
        draft = Invoice.objects.for_tenant(tenant).get(period_start=start, period_end=end)
        assert draft.status == InvoiceStatus.DRAFT
        records = UsageRecord.objects.for_tenant(tenant).filter(
            interval_start__gte=start, interval_start__lt=end
        )
        lines = list(draft.lines.all())
        # One line per GPU type × tier × region (one price version, no discount).
        keys = [(line.gpu_type, line.tier, line.region) for line in lines]
        assert len(keys) == len(set(keys)) >= 3
        assert set(keys) == set(
            records.values_list("gpu_type__slug", "tier", "region__slug").distinct()
        )
        assert total(line.amount for line in lines) == total(
            records.values_list("amount", flat=True)
        )
        assert draft.subtotal > 0

    # The monthly task builds the same draft again; finalized, ledger = invoices.
    acme = Tenant.objects.get(slug="acme")
    seeded_lines = list(
        Invoice.objects.for_tenant(acme).get().lines.values_list("description", "amount")
    )
    for invoice in Invoice.objects.all():
        invoice_draft_delete(invoice=invoice, user=None)
    drafts = invoices_draft_monthly(now=now)
    assert {d.tenant.slug for d in drafts} == {"acme", "globex"}
    for draft in drafts:
        if draft.tenant == acme:
            assert list(draft.lines.values_list("description", "amount")) == seeded_lines
        invoice_finalize(invoice=draft, user=None, now=now)
    assert UsageRecord.objects.filter(invoice__isnull=False).exists()
    assert ledger_invoice_mismatches() == []


def test_the_cost_explorer_shows_the_sixty_days(seeded):
    acme = Tenant.objects.get(slug="acme")
    owner = User.objects.get(email="alice@acme.example")
    today = datetime.now(UTC).date()
    first = today - timedelta(days=59)
    response = token_client(owner, acme).get(
        "/api/v1/usage", {"start": first.isoformat(), "end": today.isoformat(), "group_by": "day"}
    )
    assert response.status_code == 200
    days = {row["key"][:10]: Decimal(row["amount"]) for row in response.json()["results"]}
    used = sorted(day for day, amount in days.items() if amount > 0)
    assert len(used) >= 40, used
    assert used[0] <= (first + timedelta(days=4)).isoformat()
    assert used[-1] >= (today - timedelta(days=4)).isoformat()
    since = datetime.combine(first, time.min, tzinfo=UTC)
    ledger = UsageRecord.objects.for_tenant(acme).filter(interval_start__gte=since)
    assert total(days.values()) == total(ledger.values_list("amount", flat=True))

    page = signed_in_client(owner, acme).get("/billing/costs/", {"range": "last_30_days"})
    assert page.status_code == 200 and page.context["rows"] and page.context["total"] > 0


def test_the_budget_only_alerts(seeded):
    for budget in Budget.objects.all():
        assert budget.action == BudgetAction.ALERT_ONLY and budget.amount >= 1000
    assert Budget.objects.count() == 2
    assert not Job.objects.exclude(status__in=FINISHED).exists()


def test_no_history_skips_it_and_a_later_seed_adds_it(db):
    out = seed("--no-history")

    assert "History" not in out
    assert not history_jobs().exists() and not UsageRecord.objects.exists()
    assert not Invoice.objects.exists() and not Budget.objects.exists()
    assert "past jobs" in seed()
    assert history_jobs().exists()


def test_the_history_is_deterministic(db):
    seed("--no-history")
    acme = Tenant.objects.get(slug="acme")
    now = timezone.now()
    columns = ("name", "created_at", "status", "gpu_type__slug", "nodes", "gpus_per_node",
               "spot_nodes", "finished_at", "command", "status_reason")  # fmt: skip

    def history() -> list[tuple]:
        seed_demo_history([acme], now=now)
        return list(history_jobs().order_by("idempotency_key").values_list(*columns))

    first = history()
    history_jobs().delete()
    assert history() == first
