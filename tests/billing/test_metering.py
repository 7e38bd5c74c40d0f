from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction

from billing.metering import meter_tick, rollups_rebuild, tick, writers
from billing.models import (
    HourlyRollupMark,
    JobMeter,
    LiveUsageRollup,
    MonthlyRollupMark,
    UsageDailyTotal,
    UsageRecord,
    UsageRollup,
)
from jobs.models import Job, JobStatus
from jobs.services import job_delete
from marketplace.models import PriceVersion
from tests.billing.conftest import T0, live_rollup, live_rollups, make_job, set_status
from tests.billing.test_ledger_properties import cpu_job, gpu_job
from tests.concurrency import run_at_once
from tests.jobs_helpers import at_time

HOUR = timedelta(hours=1)
CPU_PRICE = Decimal("0.0125")  # demo price per vCPU-hour in region "local"


def test_running_job_is_billed_per_second_and_rolls_up(world, catalog):
    job = make_job(world, cpus=2, start=T0)
    set_status(job, JobStatus.RUNNING, T0)
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
    daily = live_rollup(job_ref=job.pk, bucket="day")
    assert daily.amount == expected and daily.bucket_start == T0.replace(hour=0)
    assert daily.gpu_type == "cpu" and daily.region == "local"
    # The hour still runs: its meter holds it, and no rollup row has been written.
    assert live_rollup(job_ref=job.pk, bucket="hour").amount == expected
    assert JobMeter.objects.get(job=job).hour == T0
    assert not UsageRollup.objects.exists()


def test_duplicate_tick_writes_nothing_twice(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0)
    meter_tick(now=T0 + timedelta(seconds=30))
    meter_tick(now=T0 + timedelta(seconds=30))
    assert UsageRecord.objects.filter(job_ref=job.pk).count() == 1
    assert live_rollup(job_ref=job.pk, bucket="day").cpu_seconds == Decimal(30)


def test_pause_is_not_billed_and_end_is_exact(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0)
    set_status(job, JobStatus.PAUSING, T0 + timedelta(seconds=10))
    set_status(job, JobStatus.PAUSED, T0 + timedelta(seconds=15))
    set_status(job, JobStatus.RESUMING, T0 + timedelta(seconds=100))
    set_status(job, JobStatus.RUNNING, T0 + timedelta(seconds=105))
    set_status(job, JobStatus.SUCCEEDED, T0 + timedelta(seconds=125))
    meter_tick(now=T0 + timedelta(seconds=300))  # one late tick catches everything up
    spans = [(r.interval_start, r.interval_end) for r in UsageRecord.objects.filter(job_ref=job.pk)]
    assert spans == [
        (T0, T0 + timedelta(seconds=15)),
        (T0 + timedelta(seconds=105), T0 + timedelta(seconds=125)),
    ]
    assert not JobMeter.objects.get(job=job).open
    meter_tick(now=T0 + timedelta(seconds=400))
    assert UsageRecord.objects.filter(job_ref=job.pk).count() == 2


def test_a_cancel_is_billed_until_the_work_ended(world, catalog):
    """`cancelling` holds compute: billed from the cancel until the backend reported the
    work gone (here 40 s of grace), a tick in between billing it as still running."""
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0)
    set_status(job, JobStatus.CANCELLING, T0 + timedelta(seconds=60))
    meter_tick(now=T0 + timedelta(seconds=90))
    assert JobMeter.objects.get(job=job).open
    set_status(job, JobStatus.CANCELLED, T0 + timedelta(seconds=100))
    meter_tick(now=T0 + timedelta(seconds=120))
    spans = [(r.interval_start, r.interval_end) for r in UsageRecord.objects.filter(job_ref=job.pk)]
    assert spans == [
        (T0, T0 + timedelta(seconds=90)),
        (T0 + timedelta(seconds=90), T0 + timedelta(seconds=100)),
    ]
    assert not JobMeter.objects.get(job=job).open


def test_a_job_stopped_before_it_ran_pays_nothing_for_its_stop(world, catalog):
    """Only `running` opens a bill: pausing or cancelling a job still provisioning (its
    pods not started) bills nothing, however long its stop takes."""
    cancelled, paused = make_job(world, start=T0), make_job(world, name="paused", start=T0)
    for job, stopping, stopped in (
        (cancelled, JobStatus.CANCELLING, JobStatus.CANCELLED),
        (paused, JobStatus.PAUSING, JobStatus.PAUSED),
    ):
        set_status(job, JobStatus.PROVISIONING, T0)
        set_status(job, stopping, T0 + timedelta(seconds=10))
        meter_tick(now=T0 + timedelta(seconds=30))
        set_status(job, stopped, T0 + timedelta(seconds=40))
    meter_tick(now=T0 + timedelta(seconds=60))
    assert not UsageRecord.objects.exists()


def test_intervals_split_at_hours_and_price_changes(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0 + timedelta(minutes=50))
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
    # Two hours of one day: one daily job rollup, summing all three records.
    daily = live_rollup(job_ref=job.pk, bucket="day")
    assert daily.amount == sum(r.amount for r in records)
    # Hour 10 has closed: its row is written; hour 11 still runs: its meter holds it.
    assert UsageRollup.objects.get(job_ref=job.pk, bucket="hour").amount == records[0].amount
    hourly = live_rollups(job_ref=job.pk, bucket="hour")
    assert [sums[2] for _, sums in sorted(hourly.items())] == [
        records[0].amount,
        records[1].amount + records[2].amount,
    ]


def test_meters_hold_the_open_hour_the_next_hour_writes_it_and_late_records_join(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0 + timedelta(minutes=58))
    meter_tick(now=T0 + timedelta(minutes=59))
    assert not UsageRollup.objects.exists()  # hour 10 still runs: its meter holds it
    assert HourlyRollupMark.objects.get().rolled_until == T0
    assert live_rollup(bucket="hour", job_ref=job.pk).cpu_seconds == Decimal(60)

    # The first tick of hour 11 writes hour 10 (this tick's piece of it included).
    meter_tick(now=T0 + timedelta(minutes=61))
    assert HourlyRollupMark.objects.get().rolled_until == T0 + timedelta(hours=1)
    hourly = UsageRollup.objects.get(bucket="hour", job_ref=job.pk)
    in_hour_10 = UsageRecord.objects.filter(job_ref=job.pk, interval_start__lt=T0 + HOUR)
    assert hourly.bucket_start == T0
    assert hourly.cpu_seconds == sum(r.cpu_seconds for r in in_hour_10) == Decimal(120)
    daily = UsageRollup.objects.get(bucket="day", job_ref=job.pk)
    assert daily.cpu_seconds == Decimal(120)  # hour 11's minute is still in the meter
    assert live_rollup(bucket="day", job_ref=job.pk).cpu_seconds == Decimal(180)
    assert JobMeter.objects.get(job=job).hour == T0 + HOUR

    # A job that ran in hour 10 but is metered only now (it ended between ticks) joins
    # the hour already written.
    late = make_job(world, name="late", start=T0)
    set_status(late, JobStatus.RUNNING, T0 + timedelta(minutes=30))
    set_status(late, JobStatus.SUCCEEDED, T0 + timedelta(minutes=31))
    meter_tick(now=T0 + timedelta(minutes=62))
    late_hourly = UsageRollup.objects.get(bucket="hour", job_ref=late.pk)
    assert late_hourly.bucket_start == T0 and late_hourly.cpu_seconds == Decimal(60)
    assert UsageRollup.objects.get(bucket="hour", job_ref=job.pk).cpu_seconds == Decimal(120)
    # Rebuilding from the ledger gives the same sums, the meters' hours then written.
    before = live_rollups()
    rollups_rebuild()
    assert live_rollups() == before
    assert not JobMeter.objects.exclude(hour=None).exists()
    assert UsageRollup.objects.get(bucket="hour", bucket_start=T0 + HOUR).cpu_seconds == 120


def test_deleting_a_job_keeps_its_pending_usage_in_the_rollups(world, catalog):
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0)
    set_status(job, JobStatus.SUCCEEDED, T0 + timedelta(minutes=5))
    meter_tick(now=T0 + timedelta(minutes=6))
    assert JobMeter.objects.get(job=job).hour == T0
    job_id, before = job.pk, live_rollups(job_ref=job.pk)
    assert before
    job.refresh_from_db()
    job_delete(job=job, user=None)
    assert not JobMeter.objects.exists()
    assert live_rollups(job_ref=job_id) == before
    assert UsageRollup.objects.get(bucket="day", job_ref=job_id).cpu_seconds == Decimal(300)


def test_monthly_rollups_sum_closed_days_and_late_records_join_them(world, catalog):
    october_31 = datetime(2026, 10, 31, tzinfo=UTC)
    november_1 = datetime(2026, 11, 1, tzinfo=UTC)
    job = make_job(world, start=october_31 + timedelta(hours=23))
    set_status(job, JobStatus.RUNNING, october_31 + timedelta(hours=23))
    meter_tick(now=october_31 + timedelta(hours=23, minutes=30))
    assert MonthlyRollupMark.objects.get().rolled_until == october_31
    assert not UsageRollup.objects.filter(bucket="month").exists()  # October 31 still runs

    # The first tick of November 1 adds October 31 (this tick's piece of it included).
    meter_tick(now=november_1 + timedelta(minutes=30))
    assert MonthlyRollupMark.objects.get().rolled_until == november_1
    october = UsageRollup.objects.get(bucket="month", job_ref=job.pk)
    october_31_daily = UsageRollup.objects.get(
        bucket="day", bucket_start=october_31, job_ref=job.pk
    )
    assert october.bucket_start == datetime(2026, 10, 1, tzinfo=UTC)
    assert october.cpu_seconds == october_31_daily.cpu_seconds == Decimal(3600)
    assert october.amount == october_31_daily.amount

    # A job that ran on October 31 but is metered only now joins October's row directly.
    late = make_job(world, name="late", start=october_31 + timedelta(hours=20))
    set_status(late, JobStatus.RUNNING, october_31 + timedelta(hours=20))
    set_status(late, JobStatus.SUCCEEDED, october_31 + timedelta(hours=20, minutes=10))
    meter_tick(now=november_1 + timedelta(minutes=40))
    assert UsageRollup.objects.get(bucket="month", job_ref=late.pk).cpu_seconds == Decimal(600)
    assert not UsageRollup.objects.filter(bucket="month", bucket_start=november_1).exists()

    # Ticks missed until November 2: the catch-up tick completes November 1, then rolls it.
    meter_tick(now=november_1 + timedelta(days=1, minutes=10))
    november = UsageRollup.objects.get(bucket="month", bucket_start=november_1, job_ref=job.pk)
    assert november.cpu_seconds == Decimal(86_400)
    # Rebuilding from the ledger gives the same sums.
    before = live_rollups()
    rollups_rebuild()
    assert live_rollups() == before


def test_query_count_is_constant(world, catalog, django_assert_max_num_queries):
    for n in range(3):
        set_status(make_job(world, name=f"a{n}", start=T0), JobStatus.RUNNING, T0)
    meter_tick(now=T0 + timedelta(seconds=10))
    # 15 for the jobs, 6 for the turn of the volumes' storage and the services' replicas
    # (billing.metering.storage, .service_replicas): on PostgreSQL its own savepoint,
    # advisory lock and commit setting around one read of each.
    with django_assert_max_num_queries(21) as few:
        meter_tick(now=T0 + timedelta(seconds=20))
    for n in range(5):
        set_status(make_job(world, name=f"b{n}", start=T0), JobStatus.RUNNING, T0)
    meter_tick(now=T0 + timedelta(seconds=30))
    with django_assert_max_num_queries(len(few.captured_queries)):
        meter_tick(now=T0 + timedelta(seconds=40))


def test_a_run_between_two_ticks_after_the_meter_closed_is_billed(world, catalog):
    """The meter closes when a job stops; a new attempt that runs and stops again before
    the next tick must still be found and billed."""
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0)
    set_status(job, JobStatus.PREEMPTED, T0 + timedelta(seconds=10))
    set_status(job, JobStatus.QUEUED, T0 + timedelta(seconds=10), attempt=2)
    meter_tick(now=T0 + timedelta(seconds=20))
    assert not JobMeter.objects.get(job=job).open
    set_status(job, JobStatus.RUNNING, T0 + timedelta(seconds=30))
    set_status(job, JobStatus.FAILED, T0 + timedelta(seconds=75))
    meter_tick(now=T0 + timedelta(seconds=90))
    spans = [
        (r.attempt, r.interval_start, r.interval_end)
        for r in UsageRecord.objects.filter(job_ref=job.pk)
    ]
    assert spans == [
        (1, T0, T0 + timedelta(seconds=10)),
        (2, T0 + timedelta(seconds=30), T0 + timedelta(seconds=75)),
    ]
    # Once caught up, the finished job is no longer a candidate of later ticks.
    assert meter_tick(now=T0 + timedelta(seconds=120)).jobs == 0


# --- the PostgreSQL fast path and the portable path write the same ledger ----


def _snapshot() -> dict:
    """Everything a tick writes, without surrogate keys and clocks."""
    return {
        "records": sorted(
            UsageRecord.objects.values_list(
                *[
                    f.attname
                    for f in UsageRecord._meta.concrete_fields
                    if f.attname not in ("id", "created_at")
                ]
            )
        ),
        "rollups": sorted(
            UsageRollup.objects.values_list(
                *[f.attname for f in UsageRollup._meta.concrete_fields if f.attname != "id"]
            )
        ),
        "live_rollups": live_rollups(),
        "totals": sorted(
            UsageDailyTotal.objects.values_list(
                *[f.attname for f in UsageDailyTotal._meta.concrete_fields if f.attname != "id"]
            )
        ),
        "meters": sorted(
            JobMeter.objects.values_list(
                *[f.attname for f in JobMeter._meta.concrete_fields if f.attname != "id"]
            )
        ),
    }


def _lifecycles(world) -> list:
    """A CPU job and a two-tier GPU job with a pause, a preemption, an hour boundary and
    a price change; plus a job that runs and ends between two ticks."""
    first = PriceVersion.objects.order_by("effective_from").first()
    t0 = (first.effective_from + timedelta(days=1)).replace(minute=40, second=0, microsecond=0)
    with at_time(t0 - timedelta(seconds=5)):  # submitted just before the timelines
        cpu, gpu, short = cpu_job(world, name="cpu"), gpu_job(world, name="gpu"), make_job(world)
    # Text the fast path must carry through JSON unchanged (quotes, escapes, non-ASCII).
    Job.objects.filter(pk=cpu.pk).update(name='cpu "α"\\n\t{', project="p,\u00e9'}")
    set_status(cpu, JobStatus.RUNNING, t0)
    set_status(gpu, JobStatus.RUNNING, t0 + timedelta(seconds=7, microseconds=250))
    set_status(cpu, JobStatus.PAUSING, t0 + timedelta(minutes=10))
    set_status(cpu, JobStatus.PAUSED, t0 + timedelta(minutes=11))
    set_status(cpu, JobStatus.RESUMING, t0 + timedelta(minutes=30))
    set_status(cpu, JobStatus.RUNNING, t0 + timedelta(minutes=31))
    set_status(gpu, JobStatus.PREEMPTED, t0 + timedelta(minutes=45))
    set_status(gpu, JobStatus.QUEUED, t0 + timedelta(minutes=45), attempt=2)
    set_status(gpu, JobStatus.RUNNING, t0 + timedelta(minutes=50))
    set_status(short, JobStatus.RUNNING, t0 + timedelta(minutes=61))
    set_status(short, JobStatus.SUCCEEDED, t0 + timedelta(minutes=62))
    old = first
    new = PriceVersion.objects.create(
        currency="USD",
        effective_from=t0 + timedelta(minutes=40),
        spot_discount_percent=60,
        reserved_1m_discount_percent=1,
        reserved_3m_discount_percent=2,
        reserved_12m_discount_percent=3,
    )
    for entry in old.entries.all():
        entry.pk, entry.version = None, new
        entry.on_demand_price = entry.on_demand_price * 3
        entry.save()
    return [t0 + timedelta(minutes=m, seconds=s) for m, s in ((5, 0), (25, 3), (60, 0), (95, 1))]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the fast path is PostgreSQL's")
def test_the_postgres_fast_path_writes_what_the_portable_path_writes(world, catalog, monkeypatch):
    ticks = _lifecycles(world)
    snapshots = {}
    for fast in (True, False):
        monkeypatch.setattr(writers, "use_postgres_bulk_sql", lambda fast=fast: fast)
        with transaction.atomic():
            for at in ticks:
                meter_tick(now=at)
                meter_tick(now=at)  # a duplicate
            snapshots[fast] = _snapshot()
            transaction.set_rollback(True)
    assert snapshots[True]["records"], "the scenario wrote nothing"
    assert {r[0] for r in snapshots[True]["records"]} == {world.tenant.pk}
    assert snapshots[True] == snapshots[False]


@pytest.fixture(params=["default", "portable"])
def writer(request, monkeypatch):
    """Each test runs with this database's own writer and with the portable one."""
    if request.param == "portable":
        monkeypatch.setattr(writers, "use_postgres_bulk_sql", lambda: False)
    return request.param


def test_rollups_count_only_records_really_inserted(world, catalog, writer):
    """Records that exist already (a cursor moved back behind the ledger) are skipped by
    the unique key, and the rollups still equal the ledger."""
    ticks = _lifecycles(world)
    for at in ticks:
        meter_tick(now=at)
    before = _snapshot()
    JobMeter.objects.update(metered_until=ticks[0], open=True)
    meter_tick(now=ticks[-1])
    after = _snapshot()
    assert after["records"] == before["records"]
    # The tenant's rollups were rebuilt, so the meters' hours are now in rollup rows:
    # the same sums.
    assert after["live_rollups"] == before["live_rollups"]
    assert after["totals"] == before["totals"]


def test_daily_totals_are_the_daily_rollups_without_the_job(world, catalog, writer):
    for at in _lifecycles(world):
        meter_tick(now=at)
    expected: dict[tuple, list] = {}
    for r in LiveUsageRollup.objects.filter(bucket="day"):
        key = (r.tenant_id, r.bucket_start, r.gpu_type, r.tier, r.region, r.currency)
        sums = expected.setdefault(key, [Decimal(0)] * 4)
        for i, field in enumerate(("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount")):
            sums[i] += getattr(r, field)
    totals = {
        (t.tenant_id, t.bucket_start, t.gpu_type, t.tier, t.region, t.currency): [
            t.gpu_seconds,
            t.cpu_seconds,
            t.amount,
            t.on_demand_amount,
        ]
        for t in UsageDailyTotal.objects.all()
    }
    assert len(expected) >= 3 and totals == expected


def test_upgrading_writes_the_hours_not_rolled_up_before_from_the_ledger(world, catalog):
    """Before migration billing/0009 the tick summed an hour's records into hourly rows
    when the hour closed; the migration writes those of the hours not closed yet, which
    the meters now never will."""
    import importlib

    from django.apps import apps

    upgrade = importlib.import_module("billing.migrations.0009_meter_holds_open_hour")
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0 + timedelta(minutes=50))
    meter_tick(now=T0 + timedelta(minutes=70))
    # The state the old code left: hour 10 rolled up, hour 11 not, nothing pending.
    rollups_rebuild()
    UsageRollup.objects.filter(bucket="hour", bucket_start=T0 + HOUR).delete()
    hour_10 = UsageRollup.objects.get(bucket="hour", bucket_start=T0)
    HourlyRollupMark.objects.update(rolled_until=T0 + HOUR)

    upgrade.roll_open_hours(apps, None)
    again = UsageRollup.objects.get(bucket="hour", bucket_start=T0)  # untouched
    assert (again.pk, again.cpu_seconds) == (hour_10.pk, hour_10.cpu_seconds) == (again.pk, 600)
    hour_11 = UsageRollup.objects.get(bucket="hour", bucket_start=T0 + HOUR)
    assert hour_11.cpu_seconds == Decimal(600) and hour_11.job_ref == job.pk
    assert (hour_11.gpu_type, hour_11.tier, hour_11.region) == ("cpu", "on_demand", "local")


@pytest.mark.django_db(transaction=True)
def test_concurrent_rounds_at_an_hours_start_count_every_second_once(world, catalog, caplog):
    """Two workers run the first tick of an hour at once (threads, each with its own
    connection): the rounds take turns step by step, the second finds each step done, and
    the rollups still equal the ledger. On SQLite the writers are serialised anyway."""
    jobs = [make_job(world, name=f"train-{n}", start=T0) for n in range(3)]
    for job in jobs:
        set_status(job, JobStatus.RUNNING, T0 + timedelta(minutes=40))
    meter_tick(now=T0 + timedelta(minutes=59, seconds=30))
    run_at_once(lambda: meter_tick(now=T0 + timedelta(minutes=60, seconds=15)))
    # Nothing was billed twice (not even caught by the unique key and repaired).
    assert "existed already" not in caplog.text
    for job in jobs:
        records = UsageRecord.objects.filter(job_ref=job.pk)
        assert sum(r.cpu_seconds for r in records) == Decimal(20 * 60 + 15)
        hours = live_rollups(job_ref=job.pk, bucket="hour")
        assert sorted(sums[1] for sums in hours.values()) == [Decimal(15), Decimal(20 * 60)]
        [day] = live_rollups(job_ref=job.pk, bucket="day").values()
        assert day[1] == Decimal(20 * 60 + 15)
    assert HourlyRollupMark.objects.get().rolled_until == T0 + HOUR


def test_a_late_tick_with_an_earlier_clock_changes_nothing(world, catalog, caplog):
    """What a concurrent round's late step looks like: its clock is before the meters."""
    job = make_job(world, start=T0)
    set_status(job, JobStatus.RUNNING, T0)
    meter_tick(now=T0 + timedelta(minutes=5))
    before = _snapshot()
    tick._tick(now=T0 + timedelta(minutes=4))
    assert _snapshot() == before
    meter_tick(now=T0 + timedelta(minutes=6))
    assert "existed already" not in caplog.text
    assert live_rollup(job_ref=job.pk, bucket="day").cpu_seconds == Decimal(360)
