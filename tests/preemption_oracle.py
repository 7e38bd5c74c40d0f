"""The victim choice's oracle: every subset, for small cases (the preemption tests and
the scheduler benchmark check `jobs.services.preemption.choose_victims` against it)."""

from __future__ import annotations

from itertools import combinations

from jobs.services.preemption import Candidate


def brute_force_victims(need: int, candidates: list[Candidate]) -> list[Candidate] | None:
    """Every subset: own-organisation ones when any of them frees enough, else all; the
    least cost, then the set whose oldest victim is newest (then the next oldest…)."""
    newest_first = sorted(candidates, key=lambda c: (c.started, c.key), reverse=True)
    age = {c.key: rank for rank, c in enumerate(newest_first)}

    def covering(pool: list[Candidate]) -> list[tuple[Candidate, ...]]:
        return [
            subset
            for size in range(len(pool) + 1)
            for subset in combinations(pool, size)
            if sum(c.units for c in subset) >= need
        ]

    options = covering([c for c in candidates if c.own]) or covering(candidates)
    if not options:
        return None
    best = min(
        options,
        key=lambda s: (sum(c.cost for c in s), sorted((age[c.key] for c in s), reverse=True)),
    )
    return sorted(best, key=lambda c: c.key)
