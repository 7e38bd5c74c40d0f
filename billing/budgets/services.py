"""Budget writes: budgets, their enforcement after each metering tick, and their webhook.

Budget enforcement reacts within one metering tick: after each tick, spend is compared
with every budget; crossing a threshold alerts once per period; at 100 % a
`pause_non_critical` budget pauses the running non-critical jobs of its scope through the
job state machine, scales its non-critical services to zero (a project's budget covers
no service) and blocks new non-critical launches. Raising the budget, deleting it or a
new period resumes the jobs and services the budget paused (only those).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import secrets
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from billing import tasks
from billing.budgets.selectors import (
    BudgetStatus,
    budget_blocks_launch,
    budget_jobs,
    budget_services,
    budget_statuses,
)
from billing.metering.tick import meter_tick
from billing.models import Budget, BudgetAction, BudgetAlert
from billing.prometheus import BUDGET_ENFORCEMENT_LAG
from billing.selectors import period_start
from billing.webhooks import webhook_post, webhook_url_validate
from console.crypto import decrypt_json, encrypt_json
from console.models import Membership, Tenant, User
from console.permissions import Role
from console.queueing import enqueue_on_commit
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.services.notifications import notify
from jobs.actors import BUDGET
from jobs.models import PAUSABLE, Job, JobStatus, Priority
from jobs.realtime import publish_budget_alert
from jobs.services import JobSpec, job_pause_once, job_resume
from services.models import Service
from services.services import service_budget_pause, service_budget_resume

log = logging.getLogger(__name__)
DEFAULT_THRESHOLDS = [50, 80, 100]
BUDGET_NOTIFY_ROLES = (Role.OWNER, Role.ADMIN, Role.FINANCE)


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
    new_secret = _new_webhook_secret() if webhook_url else ""
    try:
        with transaction.atomic():
            budget = Budget.objects.create(
                tenant=tenant,
                created_by=user,
                webhook_url=webhook_url,
                webhook_secret_encrypted=encrypt_json(new_secret) if new_secret else "",
                **values,
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
            f"A budget named “{values['name']}” exists already.",
            code=ErrorCode.CONFLICT,
            field="name",
        ) from None
    budget.new_webhook_secret = new_secret or None
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
    # A webhook gets its secret when its URL is set; no URL, no secret to keep.
    new_secret = (
        _new_webhook_secret() if webhook_url and not budget.webhook_secret_encrypted else ""
    )
    try:
        with transaction.atomic():
            for field, value in values.items():
                setattr(budget, field, value)
            budget.webhook_url = webhook_url
            if new_secret:
                budget.webhook_secret_encrypted = encrypt_json(new_secret)
            elif not webhook_url:
                budget.webhook_secret_encrypted = ""
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
            f"A budget named “{values['name']}” exists already.",
            code=ErrorCode.CONFLICT,
            field="name",
        ) from None
    budget.new_webhook_secret = new_secret or None
    # A raised amount may resume paused jobs (or a lowered one pause them) at once.
    budget_enforce(tenant=budget.tenant)
    return budget


def budget_webhook_secret_rotate(*, budget: Budget, user: User | None, request=None) -> str:
    """Give the budget a new webhook signing secret and return it: the only time it is
    readable. The old secret stops verifying at once (signatures use the stored one)."""
    if not budget.webhook_url:
        # The budget's state, not the (empty) request, is what refuses: a conflict.
        raise ServiceError("Set a webhook URL first.", code=ErrorCode.CONFLICT, field="webhook_url")
    new_secret = _new_webhook_secret()
    with transaction.atomic():
        Budget.objects.filter(pk=budget.pk).update(
            webhook_secret_encrypted=encrypt_json(new_secret)
        )
        audit_record(
            action="budget.webhook_secret_rotated",
            tenant=budget.tenant,
            actor=user,
            target=budget,
            request=request,
        )
    budget.refresh_from_db(fields=["webhook_secret_encrypted"])
    budget.new_webhook_secret = new_secret
    return new_secret


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


def budget_refuses_service(*, tenant: Tenant, priority: str) -> None:
    """A used-up organisation-wide budget refuses a new non-critical service (402), as it
    refuses a non-critical job: it would only be scaled to zero at the next tick."""
    blocking = budget_blocks_launch(tenant=tenant, project="", priority=priority)
    if blocking is not None:
        raise ServiceError(
            f"Budget “{blocking.name}” is used up for this month: only critical services "
            "can be deployed until it is raised or the month ends.",
            code=ErrorCode.PAYMENT_REQUIRED,
        )


class BudgetLaunchPolicy:
    """jobs.extensions.LaunchPolicy: a used-up budget refuses non-critical launches."""

    def check_launch(self, *, tenant: Tenant, spec: JobSpec) -> None:
        blocking = budget_blocks_launch(tenant=tenant, project=spec.project, priority=spec.priority)
        if blocking is not None:
            raise ServiceError(
                f"Budget “{blocking.name}” is used up for this month: only critical jobs can "
                "be launched until it is raised or the month ends.",
                code=ErrorCode.PAYMENT_REQUIRED,
            )


def _alert(status: BudgetStatus, threshold: int, kind: str, now: datetime) -> bool:
    """Record a threshold crossing once per period (a cleared forecast alert may fire
    again); True when it is new."""
    figure = status.spend if kind == "actual" else status.forecast
    key = {"budget": status.budget, "period_start": period_start(now), "threshold": threshold}
    try:
        with transaction.atomic():
            BudgetAlert.objects.create(**key, kind=kind, spend=figure, created_at=now)
    except IntegrityError:
        refired = BudgetAlert.objects.filter(**key, kind=kind, cleared_at__isnull=False).update(
            cleared_at=None, spend=figure, created_at=now
        )
        if not refired:
            return False
    budget = status.budget
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
            budget_jobs(budget)
            .filter(status__in=PAUSABLE, priority=Priority.CRITICAL)
            .values_list("name", flat=True)
        )
        body += " Non-critical jobs are paused and new ones are refused."
        if not budget.project:
            body += " Non-critical services are scaled to zero."
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
    publish_budget_alert(
        tenant_id=budget.tenant_id, budget=budget.name, amount=budget.amount,
        currency=budget.currency, threshold=threshold, kind=kind, spend=figure,
    )  # fmt: skip
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
        enqueue_on_commit(tasks.budget_webhook_task, budget.pk, payload)
    return True


def _new_webhook_secret() -> str:
    return "whsec_" + secrets.token_urlsafe(32)


def webhook_signature(body: bytes, *, secret: str) -> str:
    """`sha256=<hex>` HMAC of the body with the budget's own secret, for its receiver to
    verify. Per budget, so one tenant's receiver can't forge another tenant's alerts."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def _budget_webhook_secret(budget: Budget) -> str:
    """The stored secret; a budget from before per-budget secrets gets one now (its admin
    then rotates it to learn it)."""
    if budget.webhook_secret_encrypted:
        return decrypt_json(budget.webhook_secret_encrypted)
    new_secret = _new_webhook_secret()
    # Only the first sender stores its secret; a concurrent one reads the winner's.
    Budget.objects.filter(pk=budget.pk, webhook_secret_encrypted="").update(
        webhook_secret_encrypted=encrypt_json(new_secret)
    )
    budget.refresh_from_db(fields=["webhook_secret_encrypted"])
    return decrypt_json(budget.webhook_secret_encrypted)


def budget_webhook_send(*, budget: Budget, payload: dict) -> int:
    """POST the signed payload; the URL is checked again (see billing.webhooks)."""
    body = json.dumps(payload, sort_keys=True).encode()
    secret = _budget_webhook_secret(budget)
    return webhook_post(
        budget.webhook_url,
        body=body,
        headers={
            "Content-Type": "application/json",
            "X-GpuGeek-Signature": webhook_signature(body, secret=secret),
        },
    )


def _alert_thresholds(status: BudgetStatus, now: datetime) -> None:
    """Alert on each threshold spend has crossed; on a threshold only the forecast has
    crossed, once the forecast has held over it for BUDGET_FORECAST_HOLD_MINUTES; and
    clear the forecast alerts whose forecast fell back below (their jobs ended)."""
    budget = status.budget
    hold = timedelta(minutes=settings.BUDGET_FORECAST_HOLD_MINUTES)
    over_since = dict(budget.forecast_over_since)
    for threshold in budget.thresholds:
        if status.spend * 100 >= budget.amount * threshold:
            _alert(status, threshold, "actual", now)
            over_since.pop(str(threshold), None)
        elif status.forecast * 100 >= budget.amount * threshold:
            since = datetime.fromisoformat(over_since.setdefault(str(threshold), now.isoformat()))
            if now - since >= hold:
                _alert(status, threshold, "forecast", now)
        else:
            over_since.pop(str(threshold), None)
            BudgetAlert.objects.filter(
                budget=budget,
                period_start=period_start(now),
                threshold=threshold,
                kind="forecast",
                cleared_at__isnull=True,
            ).update(cleared_at=now)
    if over_since != budget.forecast_over_since:
        budget.forecast_over_since = over_since
        Budget.objects.filter(pk=budget.pk).update(forecast_over_since=over_since)


def budget_enforce(*, tenant: Tenant, now: datetime | None = None) -> list[Job]:
    """Alert on crossed thresholds; pause or resume the jobs of exhausted budgets.
    Returns the jobs it paused."""
    now = now or timezone.now()
    statuses = budget_statuses(tenant=tenant, now=now)
    for status in statuses:
        _alert_thresholds(status, now)

    paused = []
    blocking = [s for s in statuses if s.blocking]
    for status in blocking:
        budget = status.budget
        reason = (
            f"budget “{budget.name}” reached 100 % ({status.spend:.2f} of "
            f"{budget.amount:.2f} {budget.currency})"
        )
        for job in (
            budget_jobs(budget).filter(status__in=PAUSABLE).exclude(priority=Priority.CRITICAL)
        ):
            try:
                if not job_pause_once(job=job, actor=BUDGET, reason=reason):
                    continue  # paused already, by someone else
            except ServiceError:
                continue  # it finished or changed meanwhile
            BUDGET_ENFORCEMENT_LAG.observe(max(0.0, (timezone.now() - now).total_seconds()))
            paused.append(job)
            audit_record(
                action="job.paused_by_budget",
                tenant=tenant,
                actor_label="budget",
                target=job,
                metadata={"budget": budget.name},
            )

    _pause_or_resume_services(tenant, blocking)
    # Resume only what a budget paused, and only when no exhausted budget covers it now.
    for job in Job.objects.for_tenant(tenant).filter(
        status=JobStatus.PAUSED, paused_by_budget=True
    ):
        if any(not s.budget.project or s.budget.project == job.project for s in blocking):
            continue
        try:
            job_resume(job=job, actor=BUDGET, reason="budget no longer exhausted")
        except ServiceError:
            continue
        audit_record(
            action="job.resumed_by_budget", tenant=tenant, actor_label="budget", target=job
        )
    return paused


def _pause_or_resume_services(tenant: Tenant, blocking: list[BudgetStatus]) -> None:
    """Non-critical services scale to zero while a budget covering them is used up
    (services.service_budget_pause), and come back when none is."""
    paused: set[int] = set()
    for status in blocking:
        budget = status.budget
        reason = (
            f"budget “{budget.name}” reached 100 % ({status.spend:.2f} of "
            f"{budget.amount:.2f} {budget.currency})"
        )
        for service in budget_services(budget).exclude(priority=Priority.CRITICAL):
            paused.add(service.pk)
            if not service.paused_by_budget:
                service_budget_pause(service=service, reason=reason)
    for service in Service.objects.for_tenant(tenant).filter(paused_by_budget=True):
        if service.pk not in paused:
            service_budget_resume(service=service)


def meter_and_enforce(*, now: datetime | None = None) -> None:
    """One metering tick, then budget enforcement for every tenant with budgets, both as
    of the tick's `now` (so the enforcement lag counts the tick's own run time)."""
    now = now or timezone.now()
    result = meter_tick(now=now)
    tenants = set(result.tenants) | set(Budget.objects.values_list("tenant_id", flat=True))
    for tenant in Tenant.objects.filter(pk__in=tenants):
        budget_enforce(tenant=tenant, now=now)
