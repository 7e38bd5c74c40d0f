"""The self-healing alert rules as pure functions (with property tests), and the service
that records, notes and publishes them, and auto-stops an idle job when asked to."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from statistics import fmean, pstdev

import pytest
from django.db.models import F
from hypothesis import assume, given
from hypothesis import strategies as st

from console.models import Notification
from jobs import alerts
from jobs.actors import ActorKind
from jobs.alerts import (
    RunningStats,
    gpu_idle,
    loss_explodes,
    loss_values,
    memory_leak,
    utilization_unstable,
)
from jobs.models import AlertKind, JobAlert, JobEvent, JobMetricSample, JobMonitor, JobStatus
from tests.jobs.test_consumers import make_job, write_log

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
percent = st.floats(min_value=0, max_value=100, allow_nan=False)
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def series(values, *, every=timedelta(seconds=10), end=NOW):
    start = end - every * (len(values) - 1)
    return [(start + every * i, value) for i, value in enumerate(values)]


# --- utilisation unstable ------------------------------------------------------------------------


@given(st.lists(percent, min_size=5, max_size=30))
def test_unstable_is_exactly_a_stddev_above_15_points(values):
    assert utilization_unstable(series(values), NOW) == (pstdev(values) > 15)


@given(st.lists(percent, min_size=5, max_size=30), st.floats(min_value=-50, max_value=50))
def test_unstable_does_not_depend_on_the_level(values, shift):
    shifted = [v + shift for v in values]
    assert utilization_unstable(series(values), NOW) == utilization_unstable(series(shifted), NOW)


@given(st.lists(percent, min_size=1, max_size=30), st.lists(percent, min_size=1, max_size=30))
def test_unstable_looks_only_at_the_last_five_minutes(old, recent):
    old_part = series(old, end=NOW - timedelta(minutes=6))
    recent_part = series(recent, every=timedelta(seconds=5))
    assert utilization_unstable(old_part + recent_part, NOW) == utilization_unstable(
        recent_part, NOW
    )


def test_unstable_examples():
    assert utilization_unstable(series([10, 90] * 5), NOW)
    assert not utilization_unstable(series([50, 55, 60, 52, 58, 51]), NOW)
    assert not utilization_unstable(series([0, 100, 0, 100]), NOW)  # too few samples


# --- memory leak ---------------------------------------------------------------------------------


@given(
    st.floats(min_value=1, max_value=1e5),
    st.lists(st.floats(min_value=1.0501, max_value=3), min_size=3, max_size=3),
)
def test_three_growths_over_five_percent_are_a_leak(start, factors):
    values = [start]
    for factor in factors:
        values.append(values[-1] * factor)
    assert memory_leak(values)


@given(st.lists(st.floats(min_value=1, max_value=1e5), min_size=0, max_size=20))
def test_a_leak_needs_each_of_the_last_three_steps_to_grow(values):
    expected = len(values) >= 4 and all(b > a * 1.05 for a, b in zip(values[-4:], values[-3:]))
    assert memory_leak(values) == expected


@given(st.lists(st.floats(min_value=1, max_value=1e5), min_size=4, max_size=20))
def test_memory_that_does_not_grow_is_no_leak(values):
    assert not memory_leak(sorted(values, reverse=True))


def test_memory_leak_examples():
    assert memory_leak([1000, 1100, 1200, 1300])
    assert not memory_leak([1000, 1100, 1200, 1250])  # the last step is 4 %
    assert not memory_leak([1000, 1100, 1200])  # three samples are two steps


# --- loss explosion ------------------------------------------------------------------------------


@given(st.lists(finite, min_size=10, max_size=60), finite)
def test_loss_explodes_exactly_above_mean_plus_three_sigma(history, value):
    stats = RunningStats.of(history)
    mean, sigma = fmean(history), pstdev(history)
    limit = mean + 3 * sigma
    margin = 1e-6 * max(1.0, abs(mean), abs(value), sigma)
    assume(abs(value - limit) > margin)  # away from the boundary's rounding
    assert loss_explodes(stats, value) == (value > limit)


@given(st.lists(finite, min_size=0, max_size=9), finite)
def test_too_short_a_history_never_explodes(history, value):
    assert not loss_explodes(RunningStats.of(history), value)


@given(st.lists(finite, min_size=10, max_size=60), st.floats(min_value=0.1, max_value=1e3))
def test_loss_explosion_is_scale_invariant(history, scale):
    stats, scaled = RunningStats.of(history), RunningStats.of(v * scale for v in history)
    value = max(history) * 2 + 1
    assert loss_explodes(stats, value) == loss_explodes(scaled, value * scale)


@given(st.lists(finite, min_size=10, max_size=60))
def test_a_loss_at_or_below_the_mean_never_explodes(history):
    stats = RunningStats.of(history)
    assert not loss_explodes(stats, stats.mean)
    assert not loss_explodes(stats, min(history))


@given(st.lists(finite, min_size=1, max_size=60))
def test_running_stats_match_the_batch_formulas(values):
    stats = RunningStats.of(values)
    assert stats.count == len(values)
    assert math.isclose(stats.mean, fmean(values), rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(stats.stddev, pstdev(values), rel_tol=1e-6, abs_tol=1e-4)


def test_nan_and_infinite_losses_always_explode():
    stats = RunningStats.of([1.0] * 20)
    assert loss_explodes(stats, math.nan) and loss_explodes(stats, math.inf)
    assert loss_explodes(RunningStats(), math.nan)
    assert not loss_explodes(stats, 1.0)  # σ = 0: the constant itself is fine


def test_loss_values_are_read_from_common_log_formats():
    assert loss_values("step 10 loss=0.25 lr=1e-4") == [0.25]
    assert loss_values("Epoch 3 | loss: 1.5e-2") == [0.015]
    assert loss_values("train/loss:3 val_loss=9") == [3.0]
    assert math.isnan(loss_values("LOSS = nan")[0])
    assert loss_values("no numbers here, lossy=1") == []


# --- GPU idle ------------------------------------------------------------------------------------


@given(st.lists(st.floats(min_value=0, max_value=9.99), min_size=2, max_size=40))
def test_idle_when_every_reading_of_the_period_is_under_10(values):
    readings = series(values, every=timedelta(minutes=31) / (len(values) - 1))
    assert gpu_idle(readings, NOW, idle_for=timedelta(minutes=30))


@given(
    st.lists(st.floats(min_value=0, max_value=9.99), min_size=2, max_size=40),
    st.integers(min_value=0, max_value=39),
    st.floats(min_value=10, max_value=100),
)
def test_one_busy_reading_in_the_period_means_not_idle(values, index, busy):
    values[index % len(values)] = busy
    readings = series(values, every=timedelta(minutes=31) / (len(values) - 1))
    assert not gpu_idle(readings, NOW, idle_for=timedelta(minutes=30))


@given(st.lists(st.floats(min_value=0, max_value=9.99), min_size=2, max_size=40))
def test_not_idle_before_the_readings_cover_the_period(values):
    readings = series(values, every=timedelta(minutes=29) / (len(values) - 1))
    assert not gpu_idle(readings, NOW, idle_for=timedelta(minutes=30))


# --- the service ---------------------------------------------------------------------------------


def samples(job, utilizations, memory=None, every=timedelta(seconds=20)):
    rows = []
    start = NOW - every * (len(utilizations) - 1)
    for i, value in enumerate(utilizations):
        rows.append(
            JobMetricSample(
                job=job,
                at=start + every * i,
                node="rank 0",
                gpu=0,
                utilization=value,
                memory_used_mib=memory[i] if memory else 1000.0,
                memory_total_mib=80000.0,
            )
        )
    JobMetricSample.objects.bulk_create(rows)


@pytest.mark.django_db
def test_alerts_are_recorded_in_the_timeline_once_per_cooldown(world, catalog):
    job = make_job(world.tenant, gpus_per_node=1)
    write_log(job, [f"step {n} loss={1.0 - n * 0.01:.3f}" for n in range(1, 31)] + ["loss=50"])
    samples(job, [5, 95] * 8, memory=[1000 * 1.1**i for i in range(16)])
    raised = alerts.alerts_evaluate(job=job, now=NOW)
    assert sorted(a.kind for a in raised) == sorted(
        [AlertKind.UTILIZATION_UNSTABLE, AlertKind.MEMORY_LEAK, AlertKind.LOSS_EXPLOSION]
    )
    notes = JobEvent.objects.filter(job=job, actor_kind=ActorKind.ALERT)
    assert notes.filter(from_status=F("to_status")).count() == 3
    assert "log line 31" in JobAlert.objects.get(job=job, kind=AlertKind.LOSS_EXPLOSION).message
    # The loss explosion's repair (on by default): the job pauses through the state machine.
    [pause] = notes.exclude(from_status=F("to_status"))
    assert pause.to_status == JobStatus.PAUSING
    assert pause.reason.startswith("self-repair, loss explosion: loss 50 at log line 31")
    # The next tick sees the same state: nothing new within the cool-down.
    write_log(job, ["loss=80"])
    assert alerts.alerts_evaluate(job=job, now=NOW + timedelta(seconds=10)) == []
    assert JobMonitor.objects.get(job=job).log_scanned_line == 32


@pytest.mark.django_db
def test_an_idle_job_is_paused_when_auto_stop_is_on(world, catalog, settings):
    settings.GPU_IDLE_MINUTES = 10
    quiet = make_job(world.tenant, name="quiet", gpus_per_node=1)
    stopped = make_job(world.tenant, name="auto-stopped", gpus_per_node=1)
    alerts.job_monitor_set(job=stopped, idle_auto_stop=True, idle_minutes=5)
    for job in (quiet, stopped):
        samples(job, [3.0] * 40, every=timedelta(seconds=20))  # 13 minutes under 10 %
    assert [a.kind for a in alerts.alerts_evaluate(job=quiet, now=NOW)] == [AlertKind.GPU_IDLE]
    quiet.refresh_from_db()
    assert quiet.status == JobStatus.RUNNING  # warned only
    [alert] = alerts.alerts_evaluate(job=stopped, now=NOW)
    assert alert.kind == AlertKind.GPU_IDLE and alert.severity == "critical"
    stopped.refresh_from_db()
    assert stopped.status == JobStatus.PAUSING
    assert stopped.events.filter(actor_kind=ActorKind.ALERT, to_status="pausing").exists()


@pytest.mark.django_db
def test_a_loss_explosion_pauses_the_job_and_tells_its_owner_unless_turned_off(world, catalog):
    paused = make_job(world.tenant, name="diverged", gpus_per_node=1, created_by=world.member)
    kept = make_job(world.tenant, name="watched", gpus_per_node=1, created_by=world.member)
    alerts.job_monitor_set(job=kept, idle_auto_stop=False, idle_minutes=None,
                           loss_explosion_pause=False)  # fmt: skip
    for job in (paused, kept):
        write_log(job, [f"step {n} loss={2.0 - n * 0.01:.3f}" for n in range(1, 21)] + ["loss=nan"])
        [alert] = alerts.alerts_evaluate(job=job, now=NOW)
        assert alert.kind == AlertKind.LOSS_EXPLOSION and alert.severity == "critical"
        job.refresh_from_db()
    assert paused.status == JobStatus.PAUSING
    assert "pausing the job" in JobAlert.objects.get(job=paused).message
    note = Notification.objects.get(user=world.member)
    assert note.title == "diverged was paused: its loss exploded"
    assert "loss nan at log line 21" in note.body and "mean 1.895" in note.body
    assert kept.status == JobStatus.RUNNING  # alerted only
    assert "pausing" not in JobAlert.objects.get(job=kept).message
