"""The tables and columns metering writes with raw SQL, shared by the tick's writers and
the rollup statements, and the upsert clause that adds a row's sums to an existing one.

Names only, never values: every statement built from them binds its values as parameters.
"""

from __future__ import annotations

from decimal import Decimal

from billing.models import JobMeter, UsageDailyTotal, UsageRecord, UsageRollup
from jobs.models import Job

ROLLUP_KEY = ("tenant_id", "bucket", "bucket_start", "job_ref", "gpu_type", "tier", "region")
ROLLUP_LABELS = ("job_name", "project", "currency")
ROLLUP_SUMS = ("gpu_seconds", "cpu_seconds", "amount", "on_demand_amount")
ROLLUP_COLUMNS = (*ROLLUP_KEY, *ROLLUP_LABELS, *ROLLUP_SUMS)
RECORD_TABLE = UsageRecord._meta.db_table
JOB_TABLE = Job._meta.db_table
ROLLUP_TABLE = UsageRollup._meta.db_table
METER_TABLE = JobMeter._meta.db_table
TOTAL_TABLE = UsageDailyTotal._meta.db_table
TOTAL_KEY = ("tenant_id", "bucket_start", "gpu_type", "tier", "region")
TOTAL_COLUMNS = (*TOTAL_KEY, "currency", *ROLLUP_SUMS)

METER_COLUMNS = ("job_id", "metered_until", "open")
METER_PLAN_COLUMNS = (
    "hour", "day", "currency", "tier_1", "tier_2",
    *(f"{name}_{slot}" for slot in (1, 2) for name in ROLLUP_SUMS),
)  # fmt: skip
METER_SUMS = METER_PLAN_COLUMNS[5:]
# A meter's fields once its hour has gone to the rollups.
EMPTY_PENDING_HOUR = {"hour": None, "day": None, "currency": "", "tier_1": "", "tier_2": "",
              **dict.fromkeys(METER_SUMS, Decimal(0))}  # fmt: skip


def upsert_clause(table: str, key: tuple[str, ...]) -> str:
    """The ON CONFLICT clause that adds a new row's sums to an existing one."""
    increments = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in ROLLUP_SUMS)
    return f"ON CONFLICT ({', '.join(key)}) DO UPDATE SET {increments}"
