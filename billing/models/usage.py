"""The usage ledger, its rollups, budgets and their alerts.

Money: amounts are Decimal quantized to 1e-9 of the currency (AMOUNT_QUANTUM) so sums are
exact; rounding to the cent happens only on invoices.
"""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.utils import timezone

from console.tenancy import TenantOwnedModel, TenantScopedQuerySet

AMOUNT_QUANTUM = Decimal("0.000000001")
AMOUNT = {"max_digits": 24, "decimal_places": 9}
SECONDS = {"max_digits": 20, "decimal_places": 3}


class JobMeter(models.Model):
    """How far a job's usage has been written to the ledger (the metering cursor), and
    the job's usage in the hour being metered that its job rollups don't hold yet (the
    meter's pending hour).

    Each tick adds its records' sums here, to the row it rewrites anyway, rather than to
    the job's hourly and daily rollup rows: at 10,000 running jobs that is 15,000 upserts
    a tick saved. The first tick of the next hour moves every meter's hour into those rows
    in one statement. Readers see both through `LiveUsageRollup`. A job bills at most two
    tiers at once (its nodes' tier and spot), hence two slots; usage that fits neither
    (another hour, another currency, a third tier) goes to the rollup rows directly."""

    job = models.OneToOneField("jobs.Job", on_delete=models.CASCADE, related_name="meter")
    metered_until = models.DateTimeField()
    open = models.BooleanField(default=True, db_index=True)
    # The pending hour (None: none; the slots' values are then meaningless) and its day,
    # stored so that the view needs no date functions (it is the same SQL everywhere).
    hour = models.DateTimeField(null=True, blank=True)
    day = models.DateTimeField(null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True)
    tier_1 = models.CharField(max_length=16, blank=True)
    gpu_seconds_1 = models.DecimalField(default=Decimal(0), **SECONDS)
    cpu_seconds_1 = models.DecimalField(default=Decimal(0), **SECONDS)
    amount_1 = models.DecimalField(default=Decimal(0), **AMOUNT)
    on_demand_amount_1 = models.DecimalField(default=Decimal(0), **AMOUNT)
    tier_2 = models.CharField(max_length=16, blank=True)
    gpu_seconds_2 = models.DecimalField(default=Decimal(0), **SECONDS)
    cpu_seconds_2 = models.DecimalField(default=Decimal(0), **SECONDS)
    amount_2 = models.DecimalField(default=Decimal(0), **AMOUNT)
    on_demand_amount_2 = models.DecimalField(default=Decimal(0), **AMOUNT)

    def __str__(self) -> str:
        return f"job {self.job_id} metered until {self.metered_until}"


class UsageRecord(TenantOwnedModel):
    """One contiguous interval of one job attempt on one tier, priced at its start."""

    # Metering inserts thousands of records a tick, so the ledger carries no index it
    # doesn't read through: (tenant, interval_start) serves the tenant's lookups. Nor a
    # foreign-key constraint that only re-checks what the tick already knows: each one
    # cost a lookup per record at commit (15,000 a tick at 10,000 jobs). The price-book
    # and catalog rows are only ever deleted through Django, whose PROTECT checks guard
    # them; the tenant keeps its constraint, the one reference the tick doesn't lock.
    tenant = models.ForeignKey(
        "console.Tenant", on_delete=models.CASCADE, related_name="usage_records", db_index=False
    )
    # The tick writes records only for job rows it holds locked, and deleting a job goes
    # through Django (SET_NULL): the constraint would only re-check every new record.
    job = models.ForeignKey(
        "jobs.Job",
        null=True,
        on_delete=models.SET_NULL,
        related_name="usage_records",
        db_constraint=False,
    )
    # The job's id, kept when the job row is deleted (usage stays on the bill).
    job_ref = models.PositiveBigIntegerField()
    job_name = models.CharField(max_length=100)
    project = models.CharField(max_length=100, blank=True)
    attempt = models.PositiveIntegerField()
    tier = models.CharField(max_length=16)
    gpu_type = models.ForeignKey(
        "marketplace.GpuType",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    region = models.ForeignKey(
        "marketplace.Region",
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    interval_start = models.DateTimeField()
    interval_end = models.DateTimeField()
    units = models.PositiveIntegerField(help_text="GPUs, or vCPUs for CPU jobs, on this tier")
    gpu_seconds = models.DecimalField(default=Decimal(0), **SECONDS)
    cpu_seconds = models.DecimalField(default=Decimal(0), **SECONDS)
    price_version = models.ForeignKey(
        "marketplace.PriceVersion",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
        db_constraint=False,
    )
    # Per GPU-hour (or vCPU-hour), after the tenant's discount.
    unit_price = models.DecimalField(max_digits=18, decimal_places=9)
    discount_percent = models.DecimalField(max_digits=5, decimal_places=2, default=Decimal(0))
    amount = models.DecimalField(**AMOUNT)
    # The same usage at the on-demand price (for "savings vs on-demand").
    on_demand_amount = models.DecimalField(**AMOUNT)
    currency = models.CharField(max_length=3)
    # Why a record is priced at zero (e.g. a gap in the price book); never dropped.
    note = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # The invoice that billed this record (set once, when that invoice is finalized): the
    # claim that bills each record at most once. A nullable column without a default is
    # free to add and to insert (the tick never names it). Its index is partial (claimed
    # rows only), so the tick's inserts, all unclaimed, never touch it; the invoice's
    # lines and the staff report read claimed rows through it, and finalizing finds the
    # unclaimed rows through (tenant, interval_start).
    invoice = models.ForeignKey(
        "billing.Invoice",
        null=True,
        blank=True,
        on_delete=models.RESTRICT,
        related_name="usage_records",
        db_index=False,
    )

    class Meta:
        ordering = ["interval_start", "pk"]
        constraints = [
            models.UniqueConstraint(
                fields=["job_ref", "attempt", "tier", "interval_start"], name="usage_record_once"
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "interval_start"]),
            # Only the records priced at zero for a reason (a price-book gap): the staff's
            # alert reads them without scanning the ledger, and the tick's inserts of
            # priced records never touch it.
            models.Index(
                fields=["interval_start"], condition=~models.Q(note=""), name="usage_record_noted"
            ),
            models.Index(
                fields=["invoice"],
                condition=models.Q(invoice__isnull=False),
                name="usage_record_claimed",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_name} {self.tier} {self.interval_start:%H:%M:%S}: {self.amount}"


class Bucket(models.TextChoices):
    HOUR = "hour", "Hour"
    DAY = "day", "Day"
    MONTH = "month", "Month"


class UsageSums(models.Model):
    """The dimensions and sums every rollup shares; the metering tick adds to the sums."""

    gpu_type = models.CharField(max_length=40, help_text="GPU type slug, or 'cpu'")
    tier = models.CharField(max_length=16)
    region = models.CharField(max_length=40)
    gpu_seconds = models.DecimalField(default=Decimal(0), **SECONDS)
    cpu_seconds = models.DecimalField(default=Decimal(0), **SECONDS)
    amount = models.DecimalField(default=Decimal(0), **AMOUNT)
    # What the same usage would have cost on demand (for "savings vs on-demand").
    on_demand_amount = models.DecimalField(default=Decimal(0), **AMOUNT)
    currency = models.CharField(max_length=3)

    class Meta:
        abstract = True


class UsageRollup(TenantOwnedModel, UsageSums):
    """Usage summed per hour or day × GPU type × tier × region × job: what the Cost
    Explorer reads about jobs and projects, so it never scans raw records.

    Written by metering only; read through `LiveUsageRollup`. Hourly and daily rows get
    an hour's usage when the hour has closed (the meters hold the open one, see
    `JobMeter`), or at once for usage that arrives late. Monthly rows
    (`bucket_start` the 1st) sum the closed days of their month (see
    `MonthlyRollupMark`), so a year by job reads some 12 rows per job, not 365."""

    # Rollups are derived from the ledger (`rollups_rebuild`), whose records keep the
    # tenant constraint. Here it would only re-check, at each commit, every row an hour's
    # rollup move inserts (15,000 an hour at 10,000 jobs); Django still cascades a
    # tenant's deletion to them. The unique key, which leads with the tenant, serves the
    # tenant's lookups.
    tenant = models.ForeignKey(
        "console.Tenant",
        on_delete=models.CASCADE,
        related_name="usage_rollups",
        db_index=False,
        db_constraint=False,
    )
    bucket = models.CharField(max_length=5, choices=Bucket.choices)
    bucket_start = models.DateTimeField()
    # Plain values, never NULL, so the unique key below really is unique on every database.
    job_ref = models.PositiveBigIntegerField()
    job_name = models.CharField(max_length=100)
    project = models.CharField(max_length=100, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=[
                    "tenant",
                    "bucket",
                    "bucket_start",
                    "job_ref",
                    "gpu_type",
                    "tier",
                    "region",
                ],
                name="usage_rollup_unique",
            ),
        ]
        indexes = [
            models.Index(fields=["tenant", "bucket", "bucket_start"]),
            # The daily chart by job reads only the costliest jobs' days. The tick's
            # updates never change a name, so they stay HOT and don't touch it.
            models.Index(
                fields=["tenant", "bucket", "job_name", "bucket_start"],
                name="usage_rollup_job_days",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.bucket} {self.bucket_start:%Y-%m-%d %H:%M} {self.job_name}: {self.amount}"


class HourlyRollupMark(models.Model):
    """How far the meters' hours have been moved into the job rollups (one row): no meter
    holds an hour before `rolled_until`. The first tick of a new hour moves them all in
    one statement and moves the mark. No row: no tick has run yet."""

    rolled_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"hourly rollups complete before {self.rolled_until:%Y-%m-%d %H:%M}"


class MonthlyRollupMark(models.Model):
    """How far the monthly job rollups are complete (one row, a day boundary): every day
    before `rolled_until` is in them, later ones are not yet. The first tick of a new
    day adds the closed days' daily rows to their months and moves the mark; a record
    that arrives late for a day already rolled is added to its monthly row directly. No
    row: nothing is rolled up monthly yet (the Cost Explorer then reads daily rows)."""

    rolled_until = models.DateTimeField()

    def __str__(self) -> str:
        return f"monthly rollups complete before {self.rolled_until:%Y-%m-%d}"


class LiveUsageRollup(UsageSums):
    """The job rollups as every reader sees them (a database view, migration billing/0009):
    the rows of `UsageRollup`, plus each meter's hour as an hourly and a daily row. A key
    can have two rows (the day's closed hours and the hour still open): readers sum."""

    tenant_field = "tenant"
    tenant = models.ForeignKey(
        "console.Tenant", on_delete=models.DO_NOTHING, related_name="+", db_constraint=False
    )
    bucket = models.CharField(max_length=5, choices=Bucket.choices)
    bucket_start = models.DateTimeField()
    job_ref = models.PositiveBigIntegerField()
    job_name = models.CharField(max_length=100)
    project = models.CharField(max_length=100, blank=True)

    objects = TenantScopedQuerySet.as_manager()

    class Meta:
        managed = False
        db_table = "billing_usagerollup_live"

    def __str__(self) -> str:
        return f"{self.bucket} {self.bucket_start:%Y-%m-%d %H:%M} {self.job_name}: {self.amount}"


class UsageDailyTotal(TenantOwnedModel, UsageSums):
    """Usage summed per day × GPU type × tier × region, without the job or the project:
    what the Cost Explorer's charts and tables read unless they are about jobs or projects
    (a few rows a day where the job rollups have one per job). Kept by the metering tick
    with the rollups."""

    # The unique key below leads with the tenant and the day: it is the index queries use.
    tenant = models.ForeignKey(
        "console.Tenant",
        on_delete=models.CASCADE,
        related_name="usage_daily_totals",
        db_index=False,
    )
    bucket_start = models.DateTimeField(help_text="The day (00:00 UTC)")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "bucket_start", "gpu_type", "tier", "region"],
                name="usage_daily_total_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.bucket_start:%Y-%m-%d} {self.gpu_type} {self.tier}: {self.amount}"


class BudgetAction(models.TextChoices):
    PAUSE_NON_CRITICAL = "pause_non_critical", "Pause non-critical jobs at 100 %"
    ALERT_ONLY = "alert_only", "Alert only"


class Budget(TenantOwnedModel):
    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, related_name="budgets")
    name = models.CharField(max_length=100)
    amount = models.DecimalField(max_digits=18, decimal_places=6)
    currency = models.CharField(max_length=3, default="USD")
    period = models.CharField(max_length=10, default="monthly")
    thresholds = models.JSONField(default=list)  # percents, e.g. [50, 80, 100]
    action = models.CharField(
        max_length=20, choices=BudgetAction.choices, default=BudgetAction.PAUSE_NON_CRITICAL
    )
    project = models.CharField(
        max_length=100, blank=True, help_text="Only jobs of this project; empty: the whole tenant"
    )
    webhook_url = models.URLField(blank=True)
    # The key this budget's webhooks are signed with (encrypted; shown once, rotatable).
    webhook_secret_encrypted = models.TextField(blank=True)
    # Since when the forecast has been at or over each threshold ({"80": ISO time}):
    # a forecast alert fires only once the forecast has held for a while.
    forecast_over_since = models.JSONField(default=dict, blank=True)
    # Not a field: set by the budget services on the instance they return when they made
    # a new secret, so the page or API response can show it this one time.
    new_webhook_secret: str | None = None
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], name="budget_unique_name")
        ]

    def __str__(self) -> str:
        return self.name


class BudgetAlert(models.Model):
    """One threshold crossing in one period: the unique key is what stops repeats."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateTimeField()
    threshold = models.PositiveIntegerField()
    kind = models.CharField(max_length=10)  # actual | forecast
    spend = models.DecimalField(**AMOUNT)
    created_at = models.DateTimeField(default=timezone.now)
    # A forecast alert whose forecast fell below its threshold again (jobs ended).
    cleared_at = models.DateTimeField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "budget__tenant"

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["budget", "period_start", "threshold", "kind"], name="budget_alert_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.budget} {self.kind} {self.threshold}%"
