"""Services' metering: each replica's vCPU-seconds (or, for a GPU replica, GPU-seconds)
into the ledger (tier "service") from its start to its stop, at the region's CPU (or GPU
type's) price of the price-book version in force after the tenant's discount; replicas
removed by a reconcile pass or with their service are metered up to their stop first; the
Cost Explorer (GPU replicas under their GPU type) and the invoice show them."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from billing.invoices.services import invoice_draft_create
from billing.metering import meter_tick
from billing.metering.pieces import unit_hours_amount
from billing.metering.rollups import rollups_rebuild
from billing.metering.service_replicas import SERVICE_TIER, replicas_meter
from billing.models import UsageRecord, UsageRollup
from marketplace.models import Backend, GpuType, Region
from marketplace.pricing import after_tenant_discount
from marketplace.services import tenant_pricing_set
from services import reconcile, services
from services.models import ReplicaState, Service, ServiceReplica, ServiceRevision
from tests.conftest import token_client
from tests.factories import (
    GpuTypeFactory,
    NodePoolFactory,
    PriceEntryFactory,
    PriceVersionFactory,
    RegionFactory,
    TenantFactory,
    UserFactory,
)
from tests.jobs_helpers import at_time

pytestmark = pytest.mark.django_db

START = datetime(2026, 3, 2, 10, tzinfo=UTC)
HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
prices = st.decimals(min_value=Decimal("0.000001"), max_value=Decimal(10), places=6)


def priced_region(
    price: Decimal,
    *,
    since: datetime = START - timedelta(days=30),
    gpu_prices: dict[GpuType, Decimal] | None = None,
) -> Region:
    """A region with a CPU price (per vCPU-hour) and `gpu_prices` (per GPU-hour)."""
    region = RegionFactory()
    version = PriceVersionFactory(effective_from=since)
    PriceEntryFactory(version=version, region=region, on_demand_price=price)
    for gpu_type, gpu_price in (gpu_prices or {}).items():
        PriceEntryFactory(
            version=version, region=region, gpu_type=gpu_type, on_demand_price=gpu_price
        )
    return region


def make_service(
    tenant,
    region: Region,
    *,
    name: str = "api",
    cpus: int = 2,
    gpu_type: GpuType | None = None,
    gpus: int = 0,
) -> Service:
    """A service (a GPU one, on a cluster's on-demand pool, where `gpu_type` is given)."""
    pool = (
        NodePoolFactory(region=region, gpu_type=gpu_type, backend=Backend.KUBERNETES)
        if gpu_type
        else NodePoolFactory(region=region)
    )
    service = Service.objects.create(
        tenant=tenant, name=name, region=region, pool=pool,
        image="python:3.11-slim", command=["serve"], port=8080, cpus=cpus,
        gpu_type=gpu_type, gpus_per_replica=gpus,
        min_replicas=0, max_replicas=2, desired_replicas=0,
    )  # fmt: skip
    service.current_revision = ServiceRevision.objects.create(
        service=service, number=1, image=service.image, command=service.command,
        port=8080, cpus=cpus, gpus_per_replica=gpus,
    )  # fmt: skip
    service.save(update_fields=["current_revision"])
    return service


def replica(service: Service, *, started: datetime, stopped: datetime | None = None):
    state = ReplicaState.STOPPED if stopped else ReplicaState.READY
    return ServiceReplica.objects.create(
        service=service, revision=service.current_revision, state=state,
        started_at=started, stopped_at=stopped,
    )  # fmt: skip


def records(replica_id: int):
    return UsageRecord.objects.filter(tier=SERVICE_TIER, job_ref=replica_id)


def billed(replica_id: int) -> Decimal:
    # Summed here, record by record: SQLite's SUM of a decimal column is a float.
    return sum((r.amount for r in records(replica_id)), Decimal(0))


@hypothesis_settings(
    deadline=None,
    max_examples=30,
    # Each example runs in its own savepoint, rolled back: nothing is shared between them.
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    cpus=st.integers(1, 64),
    price=prices,
    ticks=st.lists(st.integers(1, 24 * 60), min_size=1, max_size=6),
)
def test_metered_amount_is_cpus_times_hours_times_price_exactly(db, cpus, price, ticks):
    with transaction.atomic():
        service = make_service(TenantFactory(), priced_region(price), cpus=cpus)
        running = replica(service, started=START)
        # Ticks at any minutes, in any order, some repeated: each second is billed once.
        for minutes in ticks:
            replicas_meter(now=START + timedelta(minutes=minutes))
        until = START + timedelta(minutes=max(ticks))
        pieces = list(records(running.pk).order_by("interval_start"))
        assert pieces[0].interval_start == START and pieces[-1].interval_end == until
        assert all(a.interval_end == b.interval_start for a, b in pairwise(pieces))
        assert all(p.interval_end - p.interval_start <= HOUR for p in pieces)
        expected = sum(
            (
                unit_hours_amount(
                    units=cpus,
                    seconds=Decimal((p.interval_end - p.interval_start).total_seconds()),
                    price_per_unit_hour=price,
                )
                for p in pieces
            ),
            Decimal(0),
        )
        assert billed(running.pk) == expected
        exact = Decimal(cpus) * Decimal(max(ticks)) / 60 * price
        assert abs(billed(running.pk) - exact) <= Decimal("0.000000001") * len(pieces)
        assert sum(p.cpu_seconds for p in pieces) == cpus * max(ticks) * 60
        transaction.set_rollback(True)


def test_a_stopped_replica_is_billed_to_its_stop_once(world):
    price = Decimal("0.04")
    service = make_service(world.tenant, priced_region(price), cpus=4)
    stopped = replica(service, started=START, stopped=START + 90 * timedelta(minutes=1))
    replicas_meter(now=START + 10 * HOUR)
    replicas_meter(now=START + 11 * HOUR)
    assert billed(stopped.pk) == 4 * Decimal("1.5") * price
    assert records(stopped.pk).latest("interval_end").interval_end == START + timedelta(minutes=90)
    assert {(r.units, r.job_name, r.region_id) for r in records(stopped.pk)} == {
        (4, "service api", service.region_id)
    }


def test_replicas_a_reconcile_pass_forgets_are_metered_first(world):
    service = make_service(world.tenant, priced_region(Decimal("0.5")), cpus=1)
    ended = replica(service, started=START, stopped=START + 2 * HOUR)
    with at_time(START + 3 * HOUR):
        reconcile.service_reconcile(service_id=service.pk)
    assert not ServiceReplica.objects.filter(pk=ended.pk).exists()
    assert billed(ended.pk) == Decimal("1.0")  # 1 vCPU × 2 h × 0.5
    meter_tick(now=START + 4 * HOUR)
    assert billed(ended.pk) == Decimal("1.0")  # and never again


def test_deleting_a_service_bills_its_replicas_up_to_the_deletion(world):
    service = make_service(world.tenant, priced_region(Decimal("0.1")), cpus=2)
    one = replica(service, started=START)
    two = replica(service, started=START + HOUR)
    with at_time(START + 3 * HOUR):
        services.service_delete(service=service, user=world.owner)
    assert not Service.objects.filter(pk=service.pk).exists()
    assert billed(one.pk) == Decimal("0.6") and billed(two.pk) == Decimal("0.4")
    meter_tick(now=START + 5 * HOUR)
    assert billed(one.pk) == Decimal("0.6") and billed(two.pk) == Decimal("0.4")


def test_the_tenant_discount_applies_and_a_missing_price_is_zero_with_a_note(world):
    tenant_pricing_set(
        tenant=world.tenant, discount_percent=Decimal(20), note="contract", user=UserFactory()
    )
    service = make_service(world.tenant, priced_region(Decimal("0.05")), cpus=2)
    ours = replica(service, started=START, stopped=START + 10 * HOUR)
    unpriced = make_service(world.tenant, RegionFactory(), name="elsewhere")
    gap = replica(unpriced, started=START, stopped=START + HOUR)
    replicas_meter(now=START + 10 * HOUR)
    assert billed(ours.pk) == Decimal("0.8")  # 2 vCPUs × 10 h × 0.05, 20 % off
    record = records(ours.pk).first()
    assert record.unit_price == after_tenant_discount(Decimal("0.05"), Decimal(20))
    assert record.discount_percent == Decimal(20) and record.on_demand_amount == record.amount
    (missing,) = records(gap.pk)
    assert missing.amount == 0 and "no CPU price" in missing.note


def test_cost_explorer_and_the_invoice_show_service_replicas(world, other_world):
    region = priced_region(Decimal("0.25"))
    service = make_service(world.tenant, region, cpus=2)
    replica(service, started=START, stopped=START + 3 * HOUR)
    theirs = make_service(other_world.tenant, region, name="theirs")
    replica(theirs, started=START, stopped=START + HOUR)
    meter_tick(now=START + 5 * HOUR)
    api = token_client(world.viewer, world.tenant)
    day = {"start": "2026-03-02", "end": "2026-03-02"}
    by_tier = api.get("/api/v1/usage", {**day, "group_by": "tier"}).json()
    assert [(r["key"], Decimal(r["amount"])) for r in by_tier["results"]] == [
        (SERVICE_TIER, Decimal("1.5"))  # 2 vCPUs × 3 h × 0.25; theirs isn't ours
    ]
    by_job = api.get("/api/v1/usage", {**day, "group_by": "job"}).json()
    assert [r["key"] for r in by_job["results"]] == ["service api"]
    page = token_client(world.viewer, world.tenant)
    filtered = page.get("/api/v1/usage", {**day, "group_by": "tier", "tier": "service"}).json()
    assert [r["key"] for r in filtered["results"]] == [SERVICE_TIER]
    invoice = invoice_draft_create(
        tenant=world.tenant,
        period_start=datetime(2026, 3, 1, tzinfo=UTC),
        period_end=datetime(2026, 4, 1, tzinfo=UTC),
    )
    (line,) = invoice.lines.all()
    assert line.description == f"CPU · service replicas · {region.slug}"
    assert (line.quantity, line.unit, line.tier) == (Decimal(6), "vCPU-hour", SERVICE_TIER)
    assert line.amount == Decimal("1.5")


def test_a_gpu_replica_is_billed_per_gpu_hour_of_its_revision_and_a_cpu_one_beside_it_as_before(
    world,
):
    gpu = GpuTypeFactory()
    region = priced_region(Decimal("0.05"), gpu_prices={gpu: Decimal("2.345678")})
    service = make_service(world.tenant, region, name="llm", cpus=8, gpu_type=gpu, gpus=1)
    # A replica runs its revision's GPUs: 3 here, though the service now asks for 1.
    service.current_revision = ServiceRevision.objects.create(
        service=service, number=2, image=service.image, command=service.command,
        port=8080, cpus=8, gpus_per_replica=3,
    )  # fmt: skip
    gpu_replica = replica(service, started=START, stopped=START + 150 * MINUTE)
    cpu_replica = replica(
        make_service(world.tenant, region, cpus=4), started=START, stopped=START + 90 * MINUTE
    )
    replicas_meter(now=START + 10 * HOUR)
    # 3 GPUs × 2.5 h × 2.345678, exactly (its 8 vCPUs are not billed beside its GPUs).
    assert billed(gpu_replica.pk) == Decimal("17.592585")
    assert {(r.units, r.gpu_type_id, r.unit_price, r.note) for r in records(gpu_replica.pk)} == {
        (3, gpu.pk, Decimal("2.345678"), "")
    }
    assert sum(r.gpu_seconds for r in records(gpu_replica.pk)) == 3 * 150 * 60
    assert sum(r.cpu_seconds for r in records(gpu_replica.pk)) == 0
    # The CPU replica: 4 vCPUs × 1.5 h × 0.05, as before.
    assert billed(cpu_replica.pk) == Decimal("0.3")
    assert {(r.units, r.gpu_type_id, r.gpu_seconds) for r in records(cpu_replica.pk)} == {
        (4, None, 0)
    }
    assert sum(r.cpu_seconds for r in records(cpu_replica.pk)) == 4 * 90 * 60


def test_a_gpu_replica_gets_the_tenant_discount_and_a_missing_gpu_price_is_a_gap(world):
    tenant_pricing_set(
        tenant=world.tenant, discount_percent=Decimal(20), note="contract", user=UserFactory()
    )
    gpu = GpuTypeFactory()
    priced = priced_region(Decimal("0.05"), gpu_prices={gpu: Decimal("2.5")})
    ours = replica(
        make_service(world.tenant, priced, gpu_type=gpu, gpus=2),
        started=START,
        stopped=START + 10 * HOUR,
    )
    # The region has CPU and `gpu` prices, none for this GPU type.
    unpriced = GpuTypeFactory()
    gap = replica(
        make_service(world.tenant, priced, name="other", gpu_type=unpriced, gpus=2),
        started=START,
        stopped=START + HOUR,
    )
    replicas_meter(now=START + 10 * HOUR)
    assert billed(ours.pk) == Decimal(40)  # 2 GPUs × 10 h × 2.5, 20 % off
    record = records(ours.pk).first()
    assert record.unit_price == after_tenant_discount(Decimal("2.5"), Decimal(20))
    assert record.discount_percent == Decimal(20) and record.on_demand_amount == record.amount
    (missing,) = records(gap.pk)
    assert (missing.amount, missing.gpu_type_id, missing.gpu_seconds) == (0, unpriced.pk, 7200)
    assert missing.note == f"no {unpriced.slug} price for {priced.slug} in the price book"


def test_gpu_replicas_roll_up_and_invoice_under_their_gpu_type(world):
    gpu = GpuTypeFactory()
    region = priced_region(Decimal("0.25"), gpu_prices={gpu: Decimal("3")})
    replica(
        make_service(world.tenant, region, name="llm", gpu_type=gpu, gpus=2),
        started=START,
        stopped=START + 3 * HOUR,
    )
    replica(make_service(world.tenant, region, cpus=2), started=START, stopped=START + 3 * HOUR)
    meter_tick(now=START + 5 * HOUR)
    api = token_client(world.viewer, world.tenant)
    day = {"start": "2026-03-02", "end": "2026-03-02"}
    by_gpu = api.get("/api/v1/usage", {**day, "group_by": "gpu_type"}).json()
    assert sorted((r["key"], Decimal(r["amount"])) for r in by_gpu["results"]) == [
        ("cpu", Decimal("1.5")),  # 2 vCPUs × 3 h × 0.25
        (gpu.slug, Decimal(18)),  # 2 GPUs × 3 h × 3
    ]
    # The rollups written as the records are metered are those a rebuild from the ledger gives.
    written = set(UsageRollup.objects.values_list("bucket", "gpu_type", "amount", "gpu_seconds"))
    rollups_rebuild()
    assert (
        set(UsageRollup.objects.values_list("bucket", "gpu_type", "amount", "gpu_seconds"))
        == written
    )
    invoice = invoice_draft_create(
        tenant=world.tenant,
        period_start=datetime(2026, 3, 1, tzinfo=UTC),
        period_end=datetime(2026, 4, 1, tzinfo=UTC),
    )
    gpu_line = invoice.lines.get(gpu_type=gpu.slug)
    assert gpu_line.description == f"{gpu.model} · service replicas · {region.slug}"
    assert (gpu_line.quantity, gpu_line.unit, gpu_line.amount) == (
        Decimal(6),
        "GPU-hour",
        Decimal(18),
    )
