from datetime import timedelta
from decimal import Decimal

from billing.metering import meter_tick
from billing.models import JobMeter, UsageRecord, UsageRollup
from marketplace.models import PriceVersion
from tests.billing.conftest import T0, S, make_job, set_status

CPU_PRICE = Decimal("0.0125")  # demo price per vCPU-hour in region "local"


def test_running_job_is_billed_per_second_and_rolls_up(world, catalog):
    job = make_job(world, cpus=2, start=T0)
    set_status(job, S.RUNNING, T0)
    meter_tick(now=T0 + timedelta(seconds=30))
    meter_tick(now=T0 + timedelta(seconds=90))
    records = list(UsageRecord.objects.filter(job_ref=job.pk))
    assert [(r.interval_start, r.interval_end) for r in records] == [
        (T0, T0 + timedelta(seconds=30)),
        (T0 + timedelta(seconds=30), T0 + timedelta(seconds=90)),
    ]
    assert sum(r.cpu_seconds for r in records) == Decimal("180.000")  # 2 vCPUs × 90 s
    expected = (Decimal(180) * CPU_PRICE / 3600).quantize(Decimal("0.000000001"))
    assert sum(r.amount for r in records) == expected
    hourly = UsageRollup.objects.get(job_ref=job.pk, bucket="hour")
    daily = UsageRollup.objects.get(job_ref=job.pk, bucket="day")
    assert hourly.amount == daily.amount == expected
    assert hourly.gpu_type == "cpu" and hourly.region == "local"


def test_duplicate_tick_writes_nothing_twice(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, S.RUNNING, T0)
    meter_tick(now=T0 + timedelta(seconds=30))
    meter_tick(now=T0 + timedelta(seconds=30))
    assert UsageRecord.objects.filter(job_ref=job.pk).count() == 1
    assert UsageRollup.objects.get(job_ref=job.pk, bucket="hour").cpu_seconds == Decimal(30)


def test_pause_is_not_billed_and_end_is_exact(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, S.RUNNING, T0)
    set_status(job, S.PAUSING, T0 + timedelta(seconds=10))
    set_status(job, S.PAUSED, T0 + timedelta(seconds=15))
    set_status(job, S.RESUMING, T0 + timedelta(seconds=100))
    set_status(job, S.RUNNING, T0 + timedelta(seconds=105))
    set_status(job, S.SUCCEEDED, T0 + timedelta(seconds=125))
    meter_tick(now=T0 + timedelta(seconds=300))  # one late tick catches everything up
    spans = [(r.interval_start, r.interval_end) for r in UsageRecord.objects.filter(job_ref=job.pk)]
    assert spans == [
        (T0, T0 + timedelta(seconds=15)),
        (T0 + timedelta(seconds=105), T0 + timedelta(seconds=125)),
    ]
    assert not JobMeter.objects.get(job=job).open
    meter_tick(now=T0 + timedelta(seconds=400))
    assert UsageRecord.objects.filter(job_ref=job.pk).count() == 2


def test_intervals_split_at_hours_and_price_changes(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, S.RUNNING, T0 + timedelta(minutes=50))
    old = PriceVersion.objects.get()
    new = PriceVersion.objects.create(
        currency="USD",
        effective_from=T0 + timedelta(minutes=80),
        spot_discount_percent=old.spot_discount_percent,
        reserved_1m_discount_percent=1,
        reserved_3m_discount_percent=2,
        reserved_12m_discount_percent=3,
    )
    for entry in old.entries.all():
        entry.pk = None
        entry.version = new
        entry.on_demand_price = entry.on_demand_price * 2
        entry.save()
    meter_tick(now=T0 + timedelta(minutes=90))
    records = list(UsageRecord.objects.filter(job_ref=job.pk))
    assert [r.interval_start.minute for r in records] == [50, 0, 20]
    assert [r.price_version_id for r in records] == [old.pk, old.pk, new.pk]
    assert records[2].unit_price == records[0].unit_price * 2
    assert UsageRollup.objects.filter(job_ref=job.pk, bucket="hour").count() == 2


def test_query_count_is_constant(world, catalog, django_assert_max_num_queries):
    for n in range(3):
        set_status(make_job(world, name=f"a{n}", start=T0), S.RUNNING, T0)
    meter_tick(now=T0 + timedelta(seconds=10))
    with django_assert_max_num_queries(14) as few:
        meter_tick(now=T0 + timedelta(seconds=20))
    for n in range(5):
        set_status(make_job(world, name=f"b{n}", start=T0), S.RUNNING, T0)
    meter_tick(now=T0 + timedelta(seconds=30))
    with django_assert_max_num_queries(len(few.captured_queries)):
        meter_tick(now=T0 + timedelta(seconds=40))
