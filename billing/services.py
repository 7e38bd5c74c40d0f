"""Billing writes: metering ticks, budgets and their enforcement.

Budget enforcement reacts within one metering tick: after each tick, spend is compared
with every budget; crossing a threshold alerts once per period; at 100 % a
`pause_non_critical` budget pauses the running non-critical jobs of its scope through the
job state machine and blocks new non-critical launches. Raising the budget, deleting it
or a new period resumes the jobs the budget paused (only those).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.urls import reverse
from django.utils import timezone

from billing.metering import meter_tick
from billing.models import Budget, BudgetAction, BudgetAlert, LiveUsageRollup
from billing.webhooks import webhook_post, webhook_url_validate
from console.models import Membership, Tenant, User
from console.permissions import Role
from console.services import ServiceError, audit_record, notify
from jobs.models import Job, JobStatus, Priority

log = logging.getLogger(__name__)
S = JobStatus
DEFAULT_THRESHOLDS = [50, 80, 100]
BUDGET_NOTIFY_ROLES = (Role.OWNER, Role.ADMIN, Role.FINANCE)


def period_start(now: datetime) -> datetime:
    return now.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def period_end(now: datetime) -> datetime:
    start = period_start(now)
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


# --- budgets (CRUD) ----


def _validate_budget(*, name: str, amount, thresholds, action: str, project: str) -> dict:
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ServiceError("Give the budget a name (up to 100 characters).", field="name")
    try:
        amount = Decimal(str(amount))
    except ArithmeticError:
        raise ServiceError("The amount is a number, e.g. 1500.00.", field="amount") from None
    if not amount.is_finite() or amount <= 0:
        raise ServiceError("A budget is more than zero.", field="amount")
    if amount.as_tuple().exponent < -6:
        raise ServiceError("Use at most 6 decimal places.", field="amount")
    if (
        not isinstance(thresholds, list)
        or not thresholds
        or not all(
            isinstance(t, int) and not isinstance(t, bool) and 1 <= t <= 200 for t in thresholds
        )
    ):
        raise ServiceError(
            "Thresholds are whole percents from 1 to 200, e.g. [50, 80, 100].", field="thresholds"
        )
    if action not in BudgetAction.values:
        raise ServiceError("The action is pause_non_critical or alert_only.", field="action")
    return {
        "name": name,
        "amount": amount,
        "thresholds": sorted(set(thresholds)),
        "action": action,
        "project": (project or "").strip(),
    }


def budget_create(
    *,
    tenant: Tenant,
    user: User | None,
    name: str,
    amount,
    thresholds=None,
    action: str = BudgetAction.PAUSE_NON_CRITICAL,
    project: str = "",
    webhook_url: str = "",
    request=None,
) -> Budget:
    values = _validate_budget(
        name=name,
        amount=amount,
        thresholds=DEFAULT_THRESHOLDS if thresholds is None else thresholds,
        action=action,
        project=project,
    )
    webhook_url = webhook_url_validate(webhook_url)
    try:
        with transaction.atomic():
            budget = Budget.objects.create(
                tenant=tenant, created_by=user, webhook_url=webhook_url, **values
            )
            audit_record(
                action="budget.created",
                tenant=tenant,
                actor=user,
                target=budget,
                request=request,
                metadata={"amount": str(budget.amount), "project": budget.project},
            )
    except IntegrityError:
        raise ServiceError(
            f"A budget named “{values['name']}” exists already.", code="conflict", field="name"
        ) from None
    budget_enforce(tenant=tenant)
    return budget


def budget_update(*, budget: Budget, user: User | None, request=None, **changes) -> Budget:
    current = {
        "name": budget.name,
        "amount": budget.amount,
        "thresholds": budget.thresholds,
        "action": budget.action,
        "project": budget.project,
    }
    webhook_url = changes.pop("webhook_url", budget.webhook_url)
    unknown = set(changes) - set(current)
    if unknown:
        raise ServiceError(f"Unknown fields: {', '.join(sorted(unknown))}.")
    values = _validate_budget(**{**current, **changes})
    webhook_url = webhook_url_validate(webhook_url)
    try:
        with transaction.atomic():
            for field, value in values.items():
                setattr(budget, field, value)
            budget.webhook_url = webhook_url
            budget.save()
            audit_record(
                action="budget.changed",
                tenant=budget.tenant,
                actor=user,
                target=budget,
                request=request,
                metadata={"changes": {k: str(v) for k, v in changes.items()}},
            )
    except IntegrityError:
        raise ServiceError(
            f"A budget named “{values['name']}” exists already.", code="conflict", field="name"
        ) from None
    # A raised amount may resume paused jobs (or a lowered one pause them) at once.
    budget_enforce(tenant=budget.tenant)
    return budget


def budget_delete(*, budget: Budget, user: User | None, request=None) -> None:
    tenant = budget.tenant
    with transaction.atomic():
        audit_record(
            action="budget.deleted",
            tenant=tenant,
            actor=user,
            target=budget,
            request=request,
            metadata={"name": budget.name},
        )
        budget.delete()
    budget_enforce(tenant=tenant)


# --- spend ----


def _scope(budget: Budget):
    rollups = LiveUsageRollup.objects.for_tenant(budget.tenant).filter(bucket="day")
    return rollups.filter(project=budget.project) if budget.project else rollups


def _jobs_in_scope(budget: Budget):
    jobs = Job.objects.for_tenant(budget.tenant)
    return jobs.filter(project=budget.project) if budget.project else jobs


def budget_spend(budget: Budget, now: datetime) -> Decimal:
    total = (
        _scope(budget)
        .filter(bucket_start__gte=period_start(now), bucket_start__lt=period_end(now))
        .aggregate(s=Sum("amount"))["s"]
    )
    return Decimal(total or 0)


def run_rate(jobs) -> Decimal:
    """Hourly cost of the given jobs that are running now."""
    from jobs.selectors import total_run_rate

    return total_run_rate(jobs.filter(status__in=[S.RUNNING, S.PAUSING]))


def budget_forecast(budget: Budget, now: datetime, spend: Decimal | None = None) -> Decimal:
    """Month-end spend if the running jobs keep running at their current rate."""
    spend = budget_spend(budget, now) if spend is None else spend
    hours_left = Decimal(str((period_end(now) - now).total_seconds() / 3600))
    return spend + run_rate(_jobs_in_scope(budget)) * hours_left


@dataclass
class BudgetStatus:
    budget: Budget
    spend: Decimal
    forecast: Decimal

    @property
    def percent(self) -> Decimal:
        return (self.spend / self.budget.amount * 100).quantize(Decimal("0.1"))

    @property
    def forecast_percent(self) -> Decimal:
        return (self.forecast / self.budget.amount * 100).quantize(Decimal("0.1"))

    @property
    def exhausted(self) -> bool:
        return self.spend >= self.budget.amount

    @property
    def blocking(self) -> bool:
        return self.exhausted and self.budget.action == BudgetAction.PAUSE_NON_CRITICAL


def budget_statuses(*, tenant: Tenant, now: datetime | None = None) -> list[BudgetStatus]:
    now = now or timezone.now()
    statuses = []
    for budget in Budget.objects.for_tenant(tenant).select_related("tenant"):
        spend = budget_spend(budget, now)
        statuses.append(BudgetStatus(budget, spend, budget_forecast(budget, now, spend)))
    return statuses


def budget_blocks_launch(*, tenant: Tenant, project: str, priority: str) -> Budget | None:
    """The exhausted pause-action budget that refuses a new non-critical launch, if any."""
    if priority == Priority.CRITICAL:
        return None
    for status in budget_statuses(tenant=tenant):
        if status.blocking and (not status.budget.project or status.budget.project == project):
            return status.budget
    return None


# --- enforcement ----


def _alert(status: BudgetStatus, threshold: int, kind: str, now: datetime) -> bool:
    """Record a threshold crossing once per period; True when it is new."""
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(
                budget=status.budget,
                period_start=period_start(now),
                threshold=threshold,
                kind=kind,
                spend=status.spend if kind == "actual" else status.forecast,
            )
    except IntegrityError:
        return False
    budget = status.budget
    figure = status.spend if kind == "actual" else status.forecast
    title = (
        f"Budget “{budget.name}” {'reached' if kind == 'actual' else 'forecast to reach'} "
        f"{threshold} %"
    )
    body = (
        f"{'Spend' if kind == 'actual' else 'Forecast'} this month: {figure:.2f} of "
        f"{budget.amount:.2f} {budget.currency}."
    )
    if kind == "actual" and threshold >= 100 and budget.action == BudgetAction.PAUSE_NON_CRITICAL:
        critical = list(
            _jobs_in_scope(budget)
            .filter(status__in=[S.RUNNING, S.PROVISIONING], priority=Priority.CRITICAL)
            .values_list("name", flat=True)
        )
        body += " Non-critical jobs are paused and new ones are refused."
        if critical:
            body += f" Critical jobs keep running: {', '.join(critical)}."
    recipients = (
        Membership.objects.for_tenant(budget.tenant)
        .filter(role__in=BUDGET_NOTIFY_ROLES)
        .select_related("user")
    )
    for membership in recipients:
        notify(
            tenant=budget.tenant,
            user=membership.user,
            title=title,
            body=body,
            url=reverse("billing:budgets"),
            level="warning" if threshold < 100 else "error",
        )
    audit_record(
        action=f"budget.threshold_{kind}",
        tenant=budget.tenant,
        actor_label="budget",
        target=budget,
        metadata={"threshold": threshold, "spend": str(figure)},
    )
    from billing.realtime import publish_budget_alert

    publish_budget_alert(budget=budget, threshold=threshold, kind=kind, spend=figure)
    if budget.webhook_url:
        payload = {
            "budget": budget.name,
            "threshold": threshold,
            "kind": kind,
            "spend": str(figure),
            "amount": str(budget.amount),
            "currency": budget.currency,
            "period_start": period_start(now).isoformat(),
        }
        transaction.on_commit(lambda: _send_webhook(budget.pk, payload))
    return True


def _send_webhook(budget_id: int, payload: dict) -> None:
    from billing.tasks import budget_webhook_task

    try:
        budget_webhook_task.delay(budget_id, payload)
    except Exception:
        log.exception("could not queue the budget webhook of budget %s", budget_id)


def webhook_signature(body: bytes) -> str:
    """`sha256=<hex>` HMAC of the body with WEBHOOK_SIGNING_SECRET, for receivers to verify."""
    key = (settings.WEBHOOK_SIGNING_SECRET or settings.SECRET_KEY).encode()
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def budget_webhook_send(*, budget: Budget, payload: dict) -> int:
    """POST the signed payload; the URL is checked again (see billing.webhooks)."""
    body = json.dumps(payload, sort_keys=True).encode()
    return webhook_post(
        budget.webhook_url,
        body=body,
        headers={
            "Content-Type": "application/json",
            "X-GpuGeek-Signature": webhook_signature(body),
        },
    )


def budget_enforce(*, tenant: Tenant, now: datetime | None = None) -> list[Job]:
    """Alert on crossed thresholds; pause or resume the jobs of exhausted budgets.
    Returns the jobs it paused."""
    from jobs.services import job_pause, job_resume

    now = now or timezone.now()
    statuses = budget_statuses(tenant=tenant, now=now)
    for status in statuses:
        for threshold in status.budget.thresholds:
            if status.spend * 100 >= status.budget.amount * threshold:
                _alert(status, threshold, "actual", now)
            elif status.forecast * 100 >= status.budget.amount * threshold:
                _alert(status, threshold, "forecast", now)

    paused = []
    blocking = [s for s in statuses if s.blocking]
    for status in blocking:
        budget = status.budget
        reason = (
            f"budget “{budget.name}” reached 100 % ({status.spend:.2f} of "
            f"{budget.amount:.2f} {budget.currency})"
        )
        for job in (
            _jobs_in_scope(budget)
            .filter(status__in=[S.RUNNING, S.PROVISIONING])
            .exclude(priority=Priority.CRITICAL)
        ):
            try:
                paused.append(
                    job_pause(
                        job=job, actor="budget", reason=reason, by_budget=True, quiet_if_done=False
                    )
                )
            except ServiceError:
                continue  # it finished or changed meanwhile
            audit_record(
                action="job.paused_by_budget",
                tenant=tenant,
                actor_label="budget",
                target=job,
                metadata={"budget": budget.name},
            )

    # Resume only what a budget paused, and only when no exhausted budget covers it now.
    for job in Job.objects.for_tenant(tenant).filter(status=S.PAUSED, paused_by_budget=True):
        if any(not s.budget.project or s.budget.project == job.project for s in blocking):
            continue
        try:
            job_resume(job=job, actor="budget", reason="budget no longer exhausted")
        except ServiceError:
            continue
        audit_record(
            action="job.resumed_by_budget", tenant=tenant, actor_label="budget", target=job
        )
    return paused


def meter_and_enforce(*, now: datetime | None = None) -> None:
    """One metering tick, then budget enforcement for every tenant with budgets."""
    result = meter_tick(now=now)
    tenants = set(result.tenants) | set(Budget.objects.values_list("tenant_id", flat=True))
    for tenant in Tenant.objects.filter(pk__in=tenants):
        budget_enforce(tenant=tenant, now=now)
