from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

from django.db import transaction

from billing.credit_notes.ledger import credit_balance_move
from billing.invoices.services import billing_profile_for
from billing.models import CreditMovementKind, LiveUsageRollup
from jobs.actors import SYSTEM
from tests.jobs_helpers import advance_to, at_time, submit


def make_job(world, *, name="train", cpus=1, priority="normal", project="", start=None):
    """A local CPU job, submitted for real; tests drive its timeline with set_status (no
    process is started)."""
    # Submitted just before `start` (its creation and first events), when one is given.
    with at_time(start - timedelta(seconds=5) if start is not None else None):
        return submit(world, name, command=["true"], cpus=cpus, priority=priority, project=project)


def set_status(job, to, at, attempt=None):
    """Move `job` to `to` at time `at` through the state machine (by its shortest legal
    path, every step at `at`); `attempt` starts a new attempt (a requeue)."""
    changes = {"attempt": attempt} if attempt else {}
    return advance_to(job, to, actor=SYSTEM, at=at, **changes)


T0 = datetime(2026, 11, 2, 10, 0, 0, tzinfo=UTC)


def give_credit(tenant, amount: str, kind=CreditMovementKind.OPENING) -> None:
    """Put `amount` on the tenant's credit balance, through the credit ledger."""
    with transaction.atomic():
        credit_balance_move(
            profile=billing_profile_for(tenant=tenant, lock=True),
            amount=Decimal(amount),
            kind=kind,
            description=kind.label,
        )


ROLLUP_SUMS = ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount")


def live_rollups(**filters) -> dict[tuple, tuple[Decimal, ...]]:
    """The job rollups as readers see them, a key's rows summed (the closed hours' row
    and a meter's open hour): {(bucket, start, job, GPU type, tier, region): sums}."""
    sums: dict[tuple, list[Decimal]] = {}
    for row in LiveUsageRollup.objects.filter(**filters):
        key = (row.bucket, row.bucket_start, row.job_ref, row.gpu_type, row.tier, row.region)
        values = sums.setdefault(key, [Decimal(0)] * 4)
        for i, field in enumerate(ROLLUP_SUMS):
            values[i] += getattr(row, field)
    return {key: tuple(values) for key, values in sums.items()}


def live_rollup(**filters) -> SimpleNamespace:
    """The one job rollup matching `filters`, its rows summed."""
    (key, sums), *others = live_rollups(**filters).items()
    assert not others, f"more than one rollup matches {filters}"
    names = ("bucket", "bucket_start", "job_ref", "gpu_type", "tier", "region")
    return SimpleNamespace(**dict(zip(names, key, strict=True)), **dict(zip(ROLLUP_SUMS, sums)))
