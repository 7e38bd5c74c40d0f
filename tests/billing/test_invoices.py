"""Invoices from the ledger: drafts, finalization, numbering, late usage, void, credit notes."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.db.models import Sum

from billing.credit_notes.services import CreditLine, credit_note_create
from billing.invoices.selectors import ledger_invoice_mismatches
from billing.invoices.services import (
    billing_profile_for,
    invoice_adjustment_add,
    invoice_draft_create,
    invoice_draft_delete,
    invoice_finalize,
    invoice_status_change,
    invoices_draft_monthly,
)
from billing.metering import meter_tick
from billing.models import Invoice, InvoiceLine, InvoiceStatus, LineKind, UsageRecord
from console.models import AuditEvent
from console.service_errors import ServiceError
from jobs.models import JobStatus
from marketplace.models import PriceVersion, TenantPricing
from tests.billing.conftest import make_job, set_status
from tests.concurrency import run_at_once
from tests.conftest import make_world

NOV = datetime(2026, 11, 1, tzinfo=UTC)
DEC = datetime(2026, 12, 1, tzinfo=UTC)
JAN = datetime(2027, 1, 1, tzinfo=UTC)
T0 = datetime(2026, 11, 2, 10, 0, tzinfo=UTC)


def run_job(world, *, start, seconds, cpus=1, name="train"):
    """A job running `seconds` from `start`, metered by ticks every 20 minutes and at its end."""
    job = make_job(world, name=name, cpus=cpus, start=start)
    set_status(job, JobStatus.RUNNING, start)
    end = start + timedelta(seconds=seconds)
    at = start + timedelta(minutes=20)
    while at < end:
        meter_tick(now=at)
        at += timedelta(minutes=20)
    set_status(job, JobStatus.SUCCEEDED, end)
    meter_tick(now=end + timedelta(seconds=1))
    return job


def ledger_sum(**filters) -> Decimal:
    """Σ amounts in Python: SQLite's SUM of decimals goes through floats."""
    return sum(UsageRecord.objects.filter(**filters).values_list("amount", flat=True), Decimal(0))


def new_price_version(at, factor=2):
    old = PriceVersion.objects.order_by("-effective_from").first()
    new = PriceVersion.objects.create(
        currency="USD",
        effective_from=at,
        spot_discount_percent=old.spot_discount_percent,
        reserved_1m_discount_percent=1,
        reserved_3m_discount_percent=2,
        reserved_12m_discount_percent=3,
    )
    for entry in old.entries.all():
        entry.pk = None
        entry.version = new
        entry.on_demand_price = entry.on_demand_price * factor
        entry.save()
    return new


def test_draft_matches_the_ledger_and_rounds_once(world, catalog):
    run_job(world, start=T0, seconds=3 * 3600 + 17, cpus=3)
    run_job(world, start=T0 + timedelta(days=3), seconds=1234, cpus=2, name="eval")
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    (line,) = draft.lines.all()
    assert line.kind == LineKind.USAGE and line.unit == "vCPU-hour" and line.gpu_type == "cpu"
    assert line.amount == ledger_sum(tenant=world.tenant)
    seconds = UsageRecord.objects.aggregate(s=Sum("cpu_seconds"))["s"]
    assert line.quantity == (seconds / 3600).quantize(Decimal("0.0001"))
    assert draft.subtotal == line.amount and draft.tax == 0
    assert draft.total == draft.subtotal.quantize(Decimal("0.01"))
    assert draft.rounding == draft.total - draft.subtotal
    assert draft.number is None and draft.status == InvoiceStatus.DRAFT
    assert not UsageRecord.objects.filter(invoice__isnull=False).exists()  # drafts claim nothing


def test_tax_and_discount(world, catalog):
    TenantPricing.objects.create(tenant=world.tenant, discount_percent=Decimal(10))
    profile = billing_profile_for(tenant=world.tenant)
    profile.tax_rate_percent, profile.tax_label = Decimal("19"), "VAT"
    profile.save()
    run_job(world, start=T0, seconds=7200, cpus=4)
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    ledger = ledger_sum()
    assert draft.subtotal == ledger  # the ledger's prices are after the discount
    assert draft.discount == (ledger * 10 / 90).quantize(Decimal("0.000000001"))
    assert draft.tax == (ledger * Decimal("0.19")).quantize(Decimal("0.000000001"))
    assert draft.tax_label == "VAT"
    assert draft.total == (ledger + draft.tax).quantize(Decimal("0.01"))
    assert draft.rounding == draft.total - (ledger + draft.tax)


def test_two_price_versions_are_two_lines(world, catalog):
    new_price_version(T0 + timedelta(minutes=30))
    run_job(world, start=T0, seconds=3600)
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    lines = list(draft.lines.all())
    assert len(lines) == 2
    assert lines[1].unit_price == lines[0].unit_price * 2
    assert {line.price_version_id for line in lines} == set(
        PriceVersion.objects.values_list("pk", flat=True)
    )
    assert sum(line.amount for line in lines) == ledger_sum()


def test_bad_periods_and_overlaps(world, catalog):
    with pytest.raises(ServiceError) as error:
        invoice_draft_create(tenant=world.tenant, period_start=DEC, period_end=NOV)
    assert error.value.code == "invalid"
    invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    with pytest.raises(ServiceError) as error:
        invoice_draft_create(
            tenant=world.tenant, period_start=NOV + timedelta(days=5), period_end=JAN
        )
    assert error.value.code == "conflict"


def test_finalize_claims_numbers_and_freezes(world, catalog):
    run_job(world, start=T0, seconds=3600)
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    now = datetime(2026, 12, 2, tzinfo=UTC)
    invoice = invoice_finalize(invoice=draft, user=world.owner, now=now)
    assert invoice.status == InvoiceStatus.OPEN and invoice.number == "GG-2026-000001"
    assert invoice.due_at == now + timedelta(days=30)
    assert UsageRecord.objects.filter(invoice=invoice).count() == UsageRecord.objects.count()
    assert AuditEvent.objects.filter(action="invoice.finalize", actor=world.owner).exists()
    with pytest.raises(ServiceError) as error:
        invoice_finalize(invoice=invoice, user=None)
    assert error.value.code == "conflict"
    with pytest.raises(ServiceError) as error:
        invoice_adjustment_add(
            invoice=invoice, description="x", amount=Decimal(1), reason="r", user=None
        )
    assert error.value.code == "conflict"
    with pytest.raises(ServiceError):
        invoice_draft_delete(invoice=invoice, user=None)


def test_empty_draft_cannot_be_finalized_and_numbers_have_no_gap(world, catalog):
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    with pytest.raises(ServiceError) as error:
        invoice_finalize(invoice=draft, user=None)
    assert error.value.code == "invalid"
    invoice_adjustment_add(
        invoice=draft, description="Setup", amount=Decimal("5"), reason="onboarding", user=None
    )
    assert invoice_finalize(invoice=draft, user=None).number.endswith("-000001")


def test_numbers_are_per_year(world, catalog):
    numbers = []
    for start, end, at in [
        (NOV, DEC, datetime(2026, 12, 1, 1, tzinfo=UTC)),
        (DEC, JAN, datetime(2027, 1, 1, 1, tzinfo=UTC)),
        (JAN, JAN + timedelta(days=31), datetime(2027, 2, 1, 1, tzinfo=UTC)),
    ]:
        draft = invoice_draft_create(tenant=world.tenant, period_start=start, period_end=end)
        invoice_adjustment_add(
            invoice=draft, description="Fee", amount=Decimal(1), reason="r", user=None
        )
        numbers.append(invoice_finalize(invoice=draft, user=None, now=at).number)
    assert numbers == ["GG-2026-000001", "GG-2027-000001", "GG-2027-000002"]


def test_late_records_go_to_the_next_invoice(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, DEC - timedelta(hours=1))
    meter_tick(now=DEC - timedelta(minutes=30))
    november = invoice_finalize(
        invoice=invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC),
        user=None,
    )
    billed = november.subtotal
    meter_tick(now=DEC + timedelta(minutes=30))  # the late tick: 30 min of November, 30 of December
    november.refresh_from_db()
    assert november.subtotal == billed == ledger_sum(invoice=november)
    december = invoice_finalize(
        invoice=invoice_draft_create(tenant=world.tenant, period_start=DEC, period_end=JAN),
        user=None,
    )
    late = [line for line in december.lines.all() if "late" in line.description]
    assert len(late) == 1
    assert not UsageRecord.objects.filter(invoice__isnull=True).exists()
    assert november.subtotal + december.subtotal == ledger_sum()
    assert ledger_invoice_mismatches() == []


def test_void_rules_and_no_rebilling(world, catalog):
    run_job(world, start=T0, seconds=3600)
    invoice = invoice_finalize(
        invoice=invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC),
        user=None,
    )
    invoice_status_change(to=InvoiceStatus.VOID, invoice=invoice, user=world.owner)
    with pytest.raises(ServiceError) as error:
        invoice_status_change(to=InvoiceStatus.VOID, invoice=invoice, user=None)
    assert error.value.code == "conflict"
    # A void invoice doesn't block a new one, and its usage stays claimed (not re-billed).
    again = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    assert not again.lines.exists()


def test_paid_invoice_cannot_be_voided(world, catalog):
    run_job(world, start=T0, seconds=3600)
    invoice = invoice_finalize(
        invoice=invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC),
        user=None,
    )
    invoice_status_change(to=InvoiceStatus.PAID, invoice=invoice, user=None)
    with pytest.raises(ServiceError) as error:
        invoice_status_change(to=InvoiceStatus.VOID, invoice=invoice, user=None)
    assert error.value.code == "conflict"
    with pytest.raises(ServiceError):
        invoice_status_change(to=InvoiceStatus.UNCOLLECTIBLE, invoice=invoice, user=None)


def finalized_with(world, amount):
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    invoice_adjustment_add(invoice=draft, description="Fee", amount=amount, reason="r", user=None)
    return invoice_finalize(invoice=draft, user=None)


def test_credit_notes_reduce_what_is_due_then_become_credit(world, catalog):
    invoice = finalized_with(world, Decimal("100"))
    note = credit_note_create(
        invoice=invoice, reason="outage", amount=Decimal("30"), user=world.owner
    )
    assert note.number == f"GGCN-{datetime.now(UTC).year}-000001"
    invoice.refresh_from_db()
    assert invoice.amount_due == Decimal("70.00") and invoice.left_to_credit == Decimal("70.00")
    invoice_status_change(to=InvoiceStatus.PAID, invoice=invoice, user=None)
    credit_note_create(
        invoice=invoice,
        reason="goodwill",
        lines=[CreditLine("a", Decimal("10")), CreditLine("b", Decimal("5.50"))],
        user=None,
    )
    assert billing_profile_for(tenant=world.tenant).credit_balance == Decimal("15.50")
    with pytest.raises(ServiceError) as error:
        credit_note_create(invoice=invoice, reason="too much", amount=Decimal("54.51"), user=None)
    assert error.value.code == "invalid"
    for bad in [
        {"reason": "", "amount": Decimal(1)},
        {"reason": "x", "amount": Decimal(0)},
        {"reason": "x", "amount": Decimal("0.001")},
        {"reason": "x"},
    ]:
        with pytest.raises(ServiceError):
            credit_note_create(invoice=invoice, user=None, **bad)


def test_credit_note_on_draft_or_void_is_a_conflict(world, catalog):
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    with pytest.raises(ServiceError) as error:
        credit_note_create(invoice=draft, reason="x", amount=Decimal(1), user=None)
    assert error.value.code == "conflict"


def test_tenant_credit_is_used_by_the_next_invoice(world, catalog):
    profile = billing_profile_for(tenant=world.tenant)
    profile.credit_balance = Decimal("40")
    profile.save()
    invoice = finalized_with(world, Decimal("100"))
    assert invoice.credits_applied == Decimal("40") and invoice.amount_due == Decimal("60")
    assert billing_profile_for(tenant=world.tenant).credit_balance == 0


def test_adjustment_needs_a_reason_and_draft_delete(world, catalog):
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    with pytest.raises(ServiceError) as error:
        invoice_adjustment_add(
            invoice=draft, description="x", amount=Decimal(1), reason=" ", user=None
        )
    assert error.value.field == "reason"
    invoice_draft_delete(invoice=draft, user=world.owner)
    assert not Invoice.objects.exists()
    assert AuditEvent.objects.filter(action="invoice.draft_delete").exists()


def test_monthly_drafts_are_idempotent(world, catalog):
    run_job(world, start=T0, seconds=3600)
    now = datetime(2026, 12, 1, 0, 15, tzinfo=UTC)
    assert len(invoices_draft_monthly(now=now)) == 1
    assert invoices_draft_monthly(now=now) == []
    (draft,) = Invoice.objects.all()
    assert (draft.period_start, draft.period_end) == (NOV, DEC)
    assert draft.subtotal == ledger_sum()


@pytest.mark.django_db(transaction=True)
def test_concurrent_finalizations_take_distinct_gap_free_numbers(catalog):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite serializes writers: the race needs PostgreSQL's row locks")
    worlds = [make_world(f"t{i}") for i in range(4)]
    drafts = []
    for w in worlds:
        draft = invoice_draft_create(tenant=w.tenant, period_start=NOV, period_end=DEC)
        invoice_adjustment_add(
            invoice=draft, description="Fee", amount=Decimal(1), reason="r", user=None
        )
        drafts.append(draft)
    queue = list(drafts)
    at = datetime(2026, 12, 2, tzinfo=UTC)

    def finalize_next():
        invoice_finalize(invoice=queue.pop(), user=None, now=at)

    run_at_once(finalize_next, copies=2)
    run_at_once(finalize_next, copies=2)
    numbers = sorted(Invoice.objects.values_list("number", flat=True))
    assert numbers == [f"GG-2026-00000{i}" for i in range(1, 5)]
    # The same draft finalized twice at once: one wins, the other is a conflict.
    draft = invoice_draft_create(tenant=worlds[0].tenant, period_start=DEC, period_end=JAN)
    invoice_adjustment_add(
        invoice=draft, description="Fee", amount=Decimal(1), reason="r", user=None
    )
    outcomes = []

    def finalize_same():
        try:
            outcomes.append(invoice_finalize(invoice=draft, user=None, now=at).number)
        except ServiceError as error:
            outcomes.append(error.code)

    run_at_once(finalize_same, copies=2)
    assert sorted(outcomes) == ["GG-2026-000005", "conflict"]


# --- property: ledger = invoices over random histories ---

from hypothesis import HealthCheck, Phase, given  # noqa: E402
from hypothesis import settings as hypothesis_settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

MONTHS = [datetime(2026, m, 1, tzinfo=UTC) for m in range(9, 13)] + [JAN]

job_plan = st.tuples(
    st.integers(0, 2),  # month
    st.integers(0, 27 * 24 - 1),  # hour of the month it starts
    st.integers(60, 5 * 3600),  # seconds it runs
    st.integers(1, 4),  # vCPUs
)


# Examples: the session's profile (50 in CI, tests/conftest.py).
@hypothesis_settings(
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    jobs=st.lists(job_plan, min_size=1, max_size=4),
    price_change=st.one_of(st.none(), st.integers(0, 3 * 30 * 24)),
    late_tick=st.booleans(),
    credit=st.integers(0, 3),
)
def test_ledger_equals_invoices_over_random_histories(
    world, catalog, jobs, price_change, late_tick, credit
):
    from django.db import transaction

    sid = transaction.savepoint()
    try:
        if price_change is not None:
            new_price_version(MONTHS[0] + timedelta(hours=price_change), factor=3)
        for i, (month, hour, seconds, cpus) in enumerate(jobs):
            start = MONTHS[month] + timedelta(hours=hour)
            job = make_job(world, name=f"j{i}", cpus=cpus, start=start)
            set_status(job, JobStatus.RUNNING, start)
            end = start + timedelta(seconds=seconds)
            if late_tick and i == 0:
                meter_tick(now=start + timedelta(seconds=seconds // 2))
                late_job, late_end = job, end  # its end is metered only after invoicing
                continue
            set_status(job, JobStatus.SUCCEEDED, end)
            meter_tick(now=end)
        numbers = []
        for m in range(3):
            draft = invoice_draft_create(
                tenant=world.tenant, period_start=MONTHS[m], period_end=MONTHS[m + 1]
            )
            if m == 0 and late_tick:
                set_status(late_job, JobStatus.SUCCEEDED, late_end)
                meter_tick(now=late_end)  # a late tick, possibly for a period being invoiced
            if not draft.lines.exists():
                invoice_adjustment_add(
                    invoice=draft, description="Fee", amount=Decimal(1), reason="r", user=None
                )
            invoice = invoice_finalize(invoice=draft, user=None, now=MONTHS[m + 1])
            numbers.append(invoice.number)
            if credit and invoice.total > credit:
                credit_note_create(
                    invoice=invoice, reason="goodwill", amount=Decimal(credit), user=None
                )
        # The last invoice sweeps anything late; then every record is billed exactly once.
        last = invoice_draft_create(
            tenant=world.tenant, period_start=MONTHS[3], period_end=MONTHS[4]
        )
        invoice_adjustment_add(
            invoice=last, description="Fee", amount=Decimal(1), reason="r", user=None
        )
        invoice_finalize(invoice=last, user=None, now=MONTHS[4])
        assert not UsageRecord.objects.filter(invoice__isnull=True).exists()
        invoiced = InvoiceLine.objects.filter(kind=LineKind.USAGE).values_list("amount", flat=True)
        assert sum(invoiced, Decimal(0)) == ledger_sum()
        assert ledger_invoice_mismatches() == []
        years = {}
        for number in Invoice.objects.values_list("number", flat=True):
            _, year, seq = number.split("-")
            years.setdefault(year, []).append(int(seq))
        for seqs in years.values():
            assert sorted(seqs) == list(range(1, len(seqs) + 1))
    finally:
        transaction.savepoint_rollback(sid)
