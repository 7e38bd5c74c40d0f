"""The database views behind `LiveUsageRollup`: the job rollups plus every meter's pending
hour (see `JobMeter`).

They are dropped before and created after every `migrate` rather than in a migration (as
django-pgviews does): SQLite rebuilds a table to alter it and refuses while a view names
it, and PostgreSQL refuses to alter a column a view reads. The SQL is the same on both: the
meter stores its hour's day, so no date function is needed.
"""

from __future__ import annotations

# A meter's pending hour as rollup rows: each of its two slots as an hourly and a daily row.
# Every column has the type of the rollup table's: PostgreSQL pushes a query's conditions
# into the branches of a UNION ALL (and so uses the table's indexes) only then.
_SLOT_ROWS = """
    SELECT -(4 * m.id + {k}) AS id, j.tenant_id AS tenant_id,
           CAST('{bucket}' AS varchar(5)) AS bucket,
           m.{start} AS bucket_start, m.job_id AS job_ref, j.name AS job_name,
           j.project AS project, COALESCE(g.slug, 'cpu') AS gpu_type, m.tier_{n} AS tier,
           r.slug AS region, m.currency AS currency, m.gpu_seconds_{n} AS gpu_seconds,
           m.cpu_seconds_{n} AS cpu_seconds, m.amount_{n} AS amount,
           m.on_demand_amount_{n} AS on_demand_amount, m.hour AS pending_hour
    FROM billing_jobmeter AS m
    JOIN jobs_job AS j ON j.id = m.job_id
    LEFT JOIN marketplace_gputype AS g ON g.id = j.gpu_type_id
    JOIN marketplace_region AS r ON r.id = j.region_id
    WHERE m.hour IS NOT NULL AND m.tier_{n} <> ''
"""
SLOTS = (("hour", "hour", 1), ("day", "day", 1), ("hour", "hour", 2), ("day", "day", 2))
ROLLUP_COLUMNS = (
    "id, tenant_id, bucket, bucket_start, job_ref, job_name, project, gpu_type, tier, region, "
    "currency, gpu_seconds, cpu_seconds, amount, on_demand_amount"
)
METER_ROLLUP = "billing_meter_rollup"
LIVE_ROLLUP = "billing_usagerollup_live"
# Dropped in this order, created in the reverse one (the second reads the first).
VIEWS = {
    LIVE_ROLLUP: (
        f"SELECT {ROLLUP_COLUMNS} FROM billing_usagerollup "  # noqa: S608 (our own names)
        f"UNION ALL SELECT {ROLLUP_COLUMNS} FROM {METER_ROLLUP}"
    ),
    METER_ROLLUP: " UNION ALL ".join(
        _SLOT_ROWS.format(k=k, bucket=bucket, start=start, n=n)
        for k, (bucket, start, n) in enumerate(SLOTS)
    ),
}
# The last column the views read: absent while billing isn't migrated that far.
NEWEST_COLUMN = ("billing_jobmeter", "tier_2")


def drop_views(using, **kwargs) -> None:
    from django.db import connections

    with connections[using].cursor() as cursor:
        for name in VIEWS:
            cursor.execute(f"DROP VIEW IF EXISTS {name}")


def create_views(using, **kwargs) -> None:
    from django.db import connections

    connection = connections[using]
    table, column = NEWEST_COLUMN
    with connection.cursor() as cursor:
        if table not in connection.introspection.table_names(cursor):
            return
        columns = {c.name for c in connection.introspection.get_table_description(cursor, table)}
        if column not in columns:
            return
        for name in VIEWS:
            cursor.execute(f"DROP VIEW IF EXISTS {name}")
        for name, sql in reversed(VIEWS.items()):
            cursor.execute(f"CREATE VIEW {name} AS {sql}")  # our own SQL, no values
