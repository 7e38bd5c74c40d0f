"""The queue simulation (jobs.expectations.simulation) and the runtime prediction
(jobs.expectations.runtime): pure functions, checked on hand-worked cases and against a
brute-force replay of admission's rules."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from jobs.expectations.runtime import (
    MIN_SAMPLES,
    history_from_rows,
    percentile,
    predict_runtime,
)
from jobs.expectations.simulation import (
    NEVER,
    Holder,
    Waiter,
    _earliest_fit,
    _Profile,
    simulate_starts,
)

POOL = ("pool", 1)
OTHER_POOL = ("pool", 2)


def waiter(job_id, gpus, runtime, pool=POOL, **more):
    return Waiter(job_id=job_id, pool_needs={pool: gpus}, runtime=runtime, **more)


def test_a_job_that_fits_now_starts_now():
    starts = simulate_starts(
        capacity={POOL: 8}, holders=[Holder({POOL: 4}, 600)], queue=[waiter(1, 4, 60)]
    )
    assert starts == {1: 0.0}


def test_a_job_starts_when_enough_running_jobs_release_their_gpus():
    holders = [Holder({POOL: 4}, 600), Holder({POOL: 2}, 300), Holder({POOL: 2}, 900)]
    # 8 GPUs all held: 2 free at 300 s, 6 at 600 s.
    starts = simulate_starts(capacity={POOL: 8}, holders=holders, queue=[waiter(1, 5, 60)])
    assert starts == {1: 600.0}


def test_jobs_ahead_take_capacity_in_queue_order():
    queue = [waiter(1, 8, 1000), waiter(2, 4, 100), waiter(3, 4, 100)]
    starts = simulate_starts(capacity={POOL: 8}, holders=[Holder({POOL: 8}, 50)], queue=queue)
    # 1 runs 50..1050; 2 and 3 together after it.
    assert starts == {1: 50.0, 2: 1050.0, 3: 1050.0}


def test_no_overtaking_in_a_pool_even_when_a_small_job_would_fit():
    queue = [waiter(1, 8, 500), waiter(2, 1, 10)]
    starts = simulate_starts(capacity={POOL: 8}, holders=[Holder({POOL: 4}, 200)], queue=queue)
    # 4 GPUs are free now, but 2 is behind 1 (admission never lets it overtake).
    assert starts == {1: 200.0, 2: 700.0}


def test_other_pools_queues_dont_hold_a_job_back():
    queue = [waiter(1, 8, 500), waiter(2, 1, 10, pool=OTHER_POOL)]
    starts = simulate_starts(
        capacity={POOL: 8, OTHER_POOL: 8}, holders=[Holder({POOL: 8}, 200)], queue=queue
    )
    assert starts == {1: 200.0, 2: 0.0}


def test_a_job_larger_than_its_pool_never_starts_nor_do_those_behind_it():
    queue = [waiter(1, 16, 60), waiter(2, 1, 60), waiter(3, 1, 60, pool=OTHER_POOL)]
    starts = simulate_starts(capacity={POOL: 8, OTHER_POOL: 1}, holders=[], queue=queue)
    assert starts == {1: None, 2: None, 3: 0.0}


def test_an_inactive_pool_has_no_capacity():
    assert simulate_starts(capacity={}, holders=[], queue=[waiter(1, 1, 60)]) == {1: None}


def test_an_overdue_running_job_is_expected_to_end_now():
    starts = simulate_starts(
        capacity={POOL: 8}, holders=[Holder({POOL: 8}, -300)], queue=[waiter(1, 8, 60)]
    )
    assert starts == {1: 0.0}


def test_a_quota_holds_back_only_its_own_tenant():
    quota = ("quota_jobs", 7)
    queue = [
        waiter(1, 1, 100, quota_needs={quota: 1}, own_order=frozenset({(10, 1)})),
        waiter(2, 1, 100, quota_needs={quota: 1}, own_order=frozenset({(10, 1)})),
        waiter(3, 1, 100, own_order=frozenset({(20, 1)})),  # another tenant
    ]
    holders = [Holder({POOL: 1, quota: 1}, 300)]
    starts = simulate_starts(capacity={POOL: 8, quota: 1}, holders=holders, queue=queue)
    # Tenant 10 runs one job at a time: 1 after the running one, 2 after 1; 3 at once.
    assert starts == {1: 300.0, 2: 400.0, 3: 0.0}


def test_placing_stops_after_the_wanted_jobs():
    queue = [waiter(1, 1, 60), waiter(2, 1, 60), waiter(3, 1, 60)]
    starts = simulate_starts(capacity={POOL: 8}, holders=[], queue=queue, wanted=[2])
    assert set(starts) == {1, 2}


def test_a_later_job_does_not_overlap_a_reservation_it_would_collide_with():
    # Tenant 10's job 1 waits for its quota until 500; job 2 (another tenant) may start
    # before that only if it ends before 1 needs the pool.
    quota = ("quota_jobs", 7)
    queue = [
        waiter(1, 8, 100, quota_needs={quota: 1}, own_order=frozenset({(10, 1)})),
        waiter(2, 8, 1000, own_order=frozenset({(20, 1)})),
    ]
    holders = [Holder({("pool", 9): 1, quota: 1}, 500)]
    starts = simulate_starts(
        capacity={POOL: 8, ("pool", 9): 1, quota: 1}, holders=holders, queue=queue
    )
    assert starts == {1: 500.0, 2: 600.0}


@dataclass
class Spec:
    tenant_id: int = 1
    project: str = ""
    launch_template_id: int | None = None
    image_id: int = 1
    gpu_type_id: int | None = 5
    max_runtime_minutes: int = 600


def test_prediction_prefers_the_project_then_template_then_image_then_gpu_type():
    rows = [
        (1, "llm", 3, 1, 5, 100.0),
        (1, "llm", 3, 1, 5, 200.0),
        (1, "llm", 3, 1, 5, 300.0),
        (1, "other", 3, 1, 5, 1000.0),
        (1, "", None, 2, 5, 5000.0),
        (1, "", None, 2, 5, 5000.0),
    ]
    history = history_from_rows(rows)
    by_project = predict_runtime(Spec(project="llm", launch_template_id=3), history)
    assert (by_project.basis, by_project.median_seconds, by_project.samples) == (
        "project",
        200.0,
        3,
    )
    # "new" has no runs: its template's four runs speak for it.
    by_template = predict_runtime(Spec(project="new", launch_template_id=3), history)
    assert (by_template.basis, by_template.median_seconds) == ("launch_template", 250.0)
    assert by_template.p90_seconds == 1000.0
    by_image = predict_runtime(Spec(project="new"), history)
    assert by_image.basis == "image"
    # Image 2 has only two runs: the GPU type's six decide.
    by_gpu = predict_runtime(Spec(image_id=2), history)
    assert (by_gpu.basis, by_gpu.samples) == ("gpu_type", 6)


def test_without_enough_history_the_max_runtime_is_the_prediction():
    history = history_from_rows([(1, "", None, 1, 5, 60.0)] * (MIN_SAMPLES - 1))
    prediction = predict_runtime(Spec(max_runtime_minutes=90), history)
    assert prediction.as_dict() == {
        "median_seconds": 5400,
        "p90_seconds": 5400,
        "samples": 0,
        "basis": "max_runtime",
    }


def test_another_tenants_history_never_counts():
    history = history_from_rows([(2, "", None, 1, 5, 60.0)] * 10)
    assert predict_runtime(Spec(tenant_id=1), history).basis == "max_runtime"


def test_a_prediction_never_exceeds_the_max_runtime():
    history = history_from_rows([(1, "", None, 1, 5, 7200.0)] * 5)
    prediction = predict_runtime(Spec(max_runtime_minutes=60), history)
    assert (prediction.median_seconds, prediction.p90_seconds) == (3600.0, 3600.0)


def test_percentile_is_nearest_rank():
    assert percentile(list(range(1, 11)), 0.9) == 9
    assert percentile([5.0], 0.9) == 5.0


def brute_force(capacity: int, holders: list[tuple[int, float]], queue: list[tuple[int, float]]):
    """One pool, strict FIFO, replayed tick by tick (times are whole seconds)."""
    running = list(holders)
    starts: list[float | None] = []
    clock = 0
    for need, runtime in queue:
        if need > capacity:
            starts.extend([None] * (len(queue) - len(starts)))
            break
        while need > capacity - sum(n for n, end in running if end > clock):
            clock += 1
        starts.append(float(clock))
        running.append((need, clock + runtime))
    return starts


@given(
    capacity=st.integers(1, 8),
    holders=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 50)), max_size=4),
    queue=st.lists(st.tuples(st.integers(1, 9), st.integers(1, 50)), max_size=6),
)
def test_one_pool_fifo_matches_a_tick_by_tick_replay(capacity, holders, queue):
    holders = [(min(n, capacity), end) for n, end in holders]
    # Holders never exceed the capacity together (admission admitted them).
    while sum(n for n, _ in holders) > capacity:
        holders.pop()
    starts = simulate_starts(
        capacity={POOL: capacity},
        holders=[Holder({POOL: n}, float(end)) for n, end in holders],
        queue=[waiter(i, n, float(runtime)) for i, (n, runtime) in enumerate(queue)],
    )
    assert [starts[i] for i in range(len(queue))] == brute_force(capacity, holders, queue)


RESOURCES = [POOL, OTHER_POOL, ("quota_gpus", 3)]


def every_change_point(needs, spans, capacity, not_before, runtime):
    """The earliest fit found the slow way: each change point of a needed resource from
    `not_before` on, in order, checked at every whole second of the run."""

    def used(resource, t):
        return sum(n for r, n, start, end in spans if r == resource and start <= t < end)

    points = {not_before} | {t for r, _, s, e in spans if r in needs for t in (s, e)}
    for start in sorted(t for t in points if t >= not_before):
        if all(
            used(resource, t) + amount <= capacity[resource]
            for resource, amount in needs.items()
            if amount
            for t in range(start, start + runtime)
        ):
            return start
    return NEVER


@given(
    capacity=st.lists(st.integers(1, 6), min_size=3, max_size=3),
    spans=st.lists(
        st.tuples(
            st.sampled_from(RESOURCES), st.integers(1, 4), st.integers(0, 40), st.integers(1, 40)
        ),
        max_size=10,
    ),
    needs=st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 7), min_size=1),
    not_before=st.integers(0, 45),
    runtime=st.integers(1, 30),
)
def test_the_earliest_fit_is_the_first_change_point_that_fits(
    capacity, spans, needs, not_before, runtime
):
    """The search jumps past a blocked step to its end instead of trying each change
    point in between: it still finds the first start that fits every resource."""
    capacity = dict(zip(RESOURCES, capacity, strict=True))
    spans = [(r, n, start, start + length) for r, n, start, length in spans]
    profiles = {resource: _Profile(0) for resource in RESOURCES}
    for resource, amount, start, end in spans:
        profiles[resource].add(amount, float(start), float(end))
    found = _earliest_fit(needs, profiles, capacity, float(not_before), float(runtime))
    assert found == every_change_point(needs, spans, capacity, not_before, runtime)
