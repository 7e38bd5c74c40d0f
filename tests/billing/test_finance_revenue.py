"""The finance console's revenue dashboard: every figure's data equals the ledger or the
invoices, exactly (Decimals; the charts' floats are those Decimals' floats), the source
rule (a finalized invoice's lines where one covers the days, else the ledger; a void
invoice counts nothing), GPU-hours, utilisation against pool capacity, top tenants for
staff only, and empty states instead of empty axes.

The usage is real: GPU and CPU jobs on the demo catalog's Kubernetes pools, on-demand and
spot, metered by `meter_tick`, in the first two whole months of the price book.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import plotly.graph_objects as go
import pytest
from django.test import override_settings
from django.urls import reverse

from billing.finance.revenue import revenue_dashboard
from billing.finance.selectors import finance_scope, month_start, next_month
from billing.invoices.services import invoice_draft_create, invoice_finalize, invoice_status_change
from billing.metering import meter_tick
from billing.models import (
    AMOUNT_QUANTUM,
    HOURS_QUANTUM,
    InvoiceLine,
    InvoiceStatus,
    LineKind,
    UsageRecord,
)
from jobs.models import JobStatus
from marketplace.models import GpuType, NodePool, PriceVersion
from tests.billing.conftest import set_status
from tests.billing.test_finance_console import by_testid, page_text
from tests.conftest import signed_in_client
from tests.factories import UserFactory
from tests.jobs_helpers import at_time, submit

TIERS = {"on_demand": "On-demand", "spot": "Spot"}


def run(world, name, *, start, hours, gpu_type=None, gpus=0, spot=False):
    """A job running `hours` from `start` on the Kubernetes demo pools in us-west,
    metered every 30 minutes and once at its end."""
    spec = {"region": "us-west", "spot_ratio": Decimal(1 if spot else 0)}
    if gpu_type:
        spec.update(gpu_type=gpu_type, gpus_per_node=gpus, cpus=None)
    else:
        spec.update(cpus=2)
    with override_settings(COMPUTE_BACKENDS=["kubernetes"]), at_time(start - timedelta(seconds=5)):
        job = submit(world, name, **spec)
    set_status(job, JobStatus.RUNNING, start)
    end = start + timedelta(hours=hours)
    at = start + timedelta(minutes=30)
    while at < end:
        meter_tick(now=at)
        at += timedelta(minutes=30)
    set_status(job, JobStatus.SUCCEEDED, end)
    meter_tick(now=end + timedelta(seconds=1))
    return job


@pytest.fixture
def months(catalog):
    """The first two whole months the price book prices."""
    first = PriceVersion.objects.order_by("effective_from").first().effective_from
    one = next_month(month_start(first))
    two = next_month(one)
    return one, two, next_month(two)


@pytest.fixture
def usage(world, other_world, months):
    """acme: H100 on-demand and CPU in month one (then invoiced), A100 spot and H100 in
    month two (not invoiced); globex: A100 on-demand in month two."""
    one, two, _end = months
    run(
        world,
        "bert",
        start=one + timedelta(days=4, hours=10),
        hours=3,
        gpu_type="h100-80gb",
        gpus=2,
    )
    run(world, "etl", start=one + timedelta(days=5, hours=1), hours=2)
    run(
        world,
        "llama",
        start=two + timedelta(days=9),
        hours=5,
        gpu_type="a100-80gb",
        gpus=4,
        spot=True,
    )
    run(world, "bert-2", start=two + timedelta(days=10), hours=1, gpu_type="h100-80gb", gpus=1)
    run(
        other_world,
        "intruder",
        start=two + timedelta(days=11),
        hours=2,
        gpu_type="a100-80gb",
        gpus=2,
    )
    draft = invoice_draft_create(tenant=world.tenant, period_start=one, period_end=two)
    invoice = invoice_finalize(invoice=draft, user=None, now=two + timedelta(days=2))
    return {"invoice": invoice}


def ledger(**filters) -> dict[tuple[str, str, str], Decimal]:
    """Σ amount of the ledger per (month, GPU type slug or cpu, tier), in Python."""
    sums: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
    for record in UsageRecord.objects.filter(**filters).select_related("gpu_type"):
        key = (
            f"{record.interval_start:%Y-%m}",
            record.gpu_type.slug if record.gpu_type else "cpu",
            record.tier,
        )
        sums[key] += record.amount
    return sums


def gpu_label(slug: str) -> str:
    return "CPU" if slug == "cpu" else GpuType.objects.get(slug=slug).model


def expected_series(sums, month_keys, position) -> dict[str, list[Decimal]]:
    series: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0)] * len(month_keys))
    for key, amount in sums.items():
        label = gpu_label(key[1]) if position == 1 else TIERS[key[2]]
        series[label][month_keys.index(key[0])] += amount
    return dict(sorted(series.items()))


def test_revenue_equals_invoice_lines_then_the_ledger(world, usage, months):
    one, two, end = months
    keys = [f"{one:%Y-%m}", f"{two:%Y-%m}"]
    invoice = usage["invoice"]
    lines = InvoiceLine.objects.filter(invoice=invoice, kind=LineKind.USAGE)
    invoiced = defaultdict(Decimal)
    for line in lines:
        invoiced[(keys[0], line.gpu_type, line.tier)] += line.amount
    assert invoiced == ledger(invoice=invoice)  # the invoice bills exactly its records
    expected = dict(invoiced)
    for key, amount in ledger(tenant=world.tenant, invoice__isnull=True).items():
        expected[key] = expected.get(key, Decimal(0)) + amount
    assert {key[0] for key in ledger(tenant=world.tenant, invoice__isnull=True)} == {keys[1]}

    scope = finance_scope(staff=False, own_tenant=world.tenant)
    dashboard = revenue_dashboard(scope=scope, start=one, end=end, now=end)
    assert dashboard.currency == "USD" and dashboard.months == keys
    assert dashboard.by_gpu_type == expected_series(expected, keys, 1)
    assert dashboard.by_tier == expected_series(expected, keys, 2)
    assert set(dashboard.by_gpu_type) == {"CPU", gpu_label("h100-80gb"), gpu_label("a100-80gb")}
    month_two = sum(a for k, a in expected.items() if k[0] == keys[1])
    assert [(m.month, m.invoiced, m.ledger) for m in dashboard.by_month] == [
        (keys[0], sum(invoiced.values()), Decimal(0)),
        (keys[1], Decimal(0), month_two),
    ]
    assert dashboard.total == sum(expected.values())
    spot = sum(a for k, a in expected.items() if k[2] == "spot")
    assert dashboard.tier_totals == {"On-demand": dashboard.total - spot, "Spot": spot}
    assert spot > 0 and all(a == a.quantize(AMOUNT_QUANTUM) for a in expected.values())
    assert dashboard.top_tenants == []  # tenants never see others


def test_gpu_hours_and_utilisation_equal_the_ledger_and_capacity(world, usage, months):
    one, two, end = months
    keys = [f"{one:%Y-%m}", f"{two:%Y-%m}"]
    seconds: dict[str, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    by_pool: dict[tuple, Decimal] = defaultdict(Decimal)
    for record in UsageRecord.objects.filter(tenant=world.tenant, gpu_type__isnull=False):
        seconds[record.gpu_type.model][keys.index(f"{record.interval_start:%Y-%m}")] += (
            record.gpu_seconds
        )
        by_pool[(record.gpu_type.slug, record.region.slug, record.tier)] += record.gpu_seconds
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    dashboard = revenue_dashboard(scope=scope, start=one, end=end, now=end)
    assert dashboard.gpu_hours == {
        label: [(s / 3600).quantize(HOURS_QUANTUM) for s in values]
        for label, values in sorted(seconds.items())
    }
    hours_in_period = Decimal((end - one).days * 24)
    assert len(dashboard.utilisation) == len(by_pool)  # a tenant sees the pools it used
    for (slug, region, tier), gpu_seconds in sorted(by_pool.items()):
        pools = NodePool.objects.filter(
            is_active=True, gpu_type__slug=slug, region__slug=region, tier=tier
        )
        gpus = sum(pool.total_gpus for pool in pools)
        sold = (gpu_seconds / 3600).quantize(HOURS_QUANTUM)
        capacity = (gpus * hours_in_period).quantize(HOURS_QUANTUM)
        row = next(r for r in dashboard.utilisation if r.label.startswith(gpu_label(slug)) and
                   r.label.endswith(TIERS[tier]))  # fmt: skip
        assert (row.gpu_hours_sold, row.capacity_gpu_hours) == (sold, capacity)
        assert row.percent == (sold * 100 / capacity).quantize(Decimal("0.01"))
        assert row.pools == ", ".join(sorted(pool.name for pool in pools))


def test_staff_see_every_tenant_and_the_top_tenants(world, other_world, usage, months):
    one, _two, end = months
    everyone = ledger()
    for line in InvoiceLine.objects.filter(invoice=usage["invoice"], kind=LineKind.USAGE):
        assert line.amount  # month one of acme counts through these, equal to its records
    staff = finance_scope(staff=True, own_tenant=None)
    dashboard = revenue_dashboard(scope=staff, start=one, end=end, now=end)
    assert dashboard.total == sum(everyone.values())
    acme = sum(ledger(tenant=world.tenant).values())
    globex = sum(ledger(tenant=other_world.tenant).values())
    assert [(t.slug, t.amount) for t in dashboard.top_tenants] == sorted(
        [("acme", acme), ("globex", globex)], key=lambda t: -t[1]
    )
    # all pool groups with capacity are listed for staff, used or not
    with_capacity = {
        (p.gpu_type.slug, p.region.slug, p.tier)
        for p in NodePool.objects.filter(is_active=True, total_gpus__gt=0, gpu_type__isnull=False)
    }
    assert len([r for r in dashboard.utilisation if r.capacity_gpu_hours]) == len(with_capacity)


def test_a_void_invoice_counts_nothing_for_its_days(world, usage, months):
    one, _two, end = months
    invoice_status_change(to=InvoiceStatus.VOID, invoice=usage["invoice"], user=None)
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    dashboard = revenue_dashboard(scope=scope, start=one, end=end, now=end)
    assert (dashboard.by_month[0].invoiced, dashboard.by_month[0].ledger) == (0, 0)
    assert dashboard.by_month[1].ledger == sum(
        ledger(tenant=world.tenant, invoice__isnull=True).values()
    )


def figures(html: str) -> dict[str, dict]:
    """The JSON figures a page embeds (json_script), by element id."""
    found = {}
    for part in html.split('<script id="')[1:]:
        element_id, rest = part.split('" type="application/json">', 1)
        found[element_id] = json.loads(rest.split("</script>", 1)[0])
    return found


def test_the_page_hands_those_figures_to_plotly(world, usage, months):
    one, two, end = months
    client = signed_in_client(world.finance, world.tenant)
    query = {"period_from": f"{one:%Y-%m}", "period_to": f"{two:%Y-%m}"}
    html = page_text(client.get(reverse("billing:finance_revenue"), query))
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    dashboard = revenue_dashboard(scope=scope, start=one, end=end, now=end)
    embedded = figures(html)
    assert {"fig-gpu", "fig-tier", "fig-tiers", "fig-hours"} <= set(embedded)
    assert "fig-top" not in embedded  # staff only
    by_name = {trace["name"]: trace["y"] for trace in embedded["fig-gpu"]["data"]}
    assert by_name == {k: [float(v) for v in values] for k, values in dashboard.by_gpu_type.items()}
    assert embedded["fig-gpu"]["data"][0]["x"] == dashboard.months
    pie = embedded["fig-tiers"]["data"][0]
    assert dict(zip(pie["labels"], pie["values"], strict=True)) == {
        k: float(v) for k, v in dashboard.tier_totals.items()
    }
    for figure in embedded.values():
        go.Figure(figure)  # valid Plotly JSON
    assert "not yet invoiced" in by_testid_source(html)
    assert by_testid(html, "revenue-total") == f"{dashboard.total.quantize(Decimal('0.01'))} USD"


def by_testid_source(html: str) -> str:
    start = html.index('data-testid="revenue-source"')
    return html[start : html.index("</p>", start)]


def test_staff_page_ranks_tenants_and_filters_to_one(world, other_world, usage, months):
    one, two, _end = months
    client = signed_in_client(UserFactory(email="cfo@gpugeek.test", is_staff=True))
    query = {"period_from": f"{one:%Y-%m}", "period_to": f"{two:%Y-%m}"}
    html = page_text(client.get(reverse("billing:finance_revenue"), query))
    go.Figure(figures(html)["fig-top"])
    top = figures(html)["fig-top"]["data"][0]
    assert sorted(top["y"]) == ["Acme Corp (acme)", "Globex Corp (globex)"]
    html = page_text(client.get(reverse("billing:finance_revenue"), {**query, "tenant": "globex"}))
    assert "fig-top" not in figures(html)
    globex = sum(ledger(tenant=other_world.tenant).values()).quantize(Decimal("0.01"))
    assert by_testid(html, "revenue-total") == f"{globex} USD"


def test_empty_dashboard_says_what_will_appear(world, catalog):
    client = signed_in_client(world.finance, world.tenant)
    html = page_text(client.get(reverse("billing:finance_revenue")))
    assert "No revenue in this period yet" in html and "stacked by GPU type" in html
    assert "No GPU-hours in this period" in html and "Nothing is overdue" in html
    embedded = figures(html)
    assert not {"fig-gpu", "fig-tier", "fig-tiers", "fig-hours", "fig-util"} & set(embedded)
    assert 'data-figure-id="fig-ageing"' not in html  # no empty axes


def test_bad_filters_are_explained(world):
    client = signed_in_client(world.finance, world.tenant)
    url = reverse("billing:finance_revenue")
    html = page_text(client.get(url, {"period_from": "2024-01", "period_to": "2026-06"}))
    assert "at most 24 months" in html
    html = page_text(client.get(url, {"currency": "dollars"}))
    assert 'data-testid="revenue-total"' not in html and "flash-error" in html


def test_other_currencies_are_named_not_mixed(world, usage, months):
    one, _two, end = months
    scope = finance_scope(staff=False, own_tenant=world.tenant)
    dashboard = revenue_dashboard(scope=scope, start=one, end=end, now=end, currency="EUR")
    assert dashboard.currency == "EUR" and dashboard.total == 0
    assert dashboard.other_currencies == {"USD": sum(ledger(tenant=world.tenant).values())}
    assert datetime(one.year, one.month, 1, tzinfo=UTC) == dashboard.start
