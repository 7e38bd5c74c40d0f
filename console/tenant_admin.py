"""Platform staff administering an organisation: suspend and reactivate it, weigh its
fair share of shared pools.

A suspension refuses the organisation's launches and resumes and pauses its running
jobs. Console doesn't know jobs: it sends `tenant_suspended` / `tenant_reactivated`
inside the transaction that changed the tenant, and jobs (which connects to them in
`JobsConfig.ready()`) pauses or re-admits through its own state machine. Sent inside
the transaction, so a suspension whose pauses fail is not recorded half-done; the backend
calls themselves are queued after commit by jobs.
"""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.dispatch import Signal
from django.http import HttpRequest
from django.utils import timezone

from console.models import Tenant, User
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record

# Sent with `tenant` and `reason`, inside the suspending transaction (jobs pauses the
# tenant's running jobs). Sent again when staff repeat a suspension, so a job that was
# starting at the first one is paused too.
tenant_suspended = Signal()
# Sent with `tenant`, inside the reactivating transaction (jobs re-admits its queue).
tenant_reactivated = Signal()


class TenantSuspended(ServiceError):
    """A launch or resume refused because the organisation is suspended (API 403)."""

    def __init__(self, reason: str):
        super().__init__(
            f"Your organisation is suspended: {reason}. Contact support.", code=ErrorCode.FORBIDDEN
        )


def _require_staff(user: User) -> None:
    if not user.is_staff:
        raise ServiceError("Only platform staff can change this.", code=ErrorCode.FORBIDDEN)


def suspended_tenant_ids() -> set[int]:
    return set(Tenant.objects.filter(suspended_at__isnull=False).values_list("pk", flat=True))


@transaction.atomic
def tenant_suspend(
    *, tenant: Tenant, reason: str, user: User, request: HttpRequest | None = None
) -> Tenant:
    """Suspend an organisation with a reason shown to its members. Repeating it keeps
    the first date and reason and writes no second audit record, but asks jobs again to
    pause what runs (a job that was starting the first time)."""
    _require_staff(user)
    reason = (reason or "").strip()
    if not reason:
        raise ServiceError("Give the reason for the suspension.", field="reason")
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    if tenant.suspended_at is None:
        tenant.suspended_at = timezone.now()
        tenant.suspension_reason = reason
        tenant.save(update_fields=["suspended_at", "suspension_reason"])
        audit_record(
            action="tenant.suspended",
            tenant=tenant,
            actor=user,
            target=tenant,
            request=request,
            metadata={"reason": reason},
        )
    tenant_suspended.send(sender=Tenant, tenant=tenant, reason=tenant.suspension_reason)
    return tenant


@transaction.atomic
def tenant_reactivate(*, tenant: Tenant, user: User, request: HttpRequest | None = None) -> Tenant:
    """Lift a suspension. Jobs it paused stay paused: their users resume them (nothing
    restarts, and starts billing, without someone asking). Repeating it changes nothing."""
    _require_staff(user)
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    if tenant.suspended_at is None:
        return tenant
    reason = tenant.suspension_reason
    tenant.suspended_at = None
    tenant.suspension_reason = ""
    tenant.save(update_fields=["suspended_at", "suspension_reason"])
    audit_record(
        action="tenant.reactivated",
        tenant=tenant,
        actor=user,
        target=tenant,
        request=request,
        metadata={"suspension_reason": reason},
    )
    tenant_reactivated.send(sender=Tenant, tenant=tenant)
    return tenant


@transaction.atomic
def tenant_fair_share_set(
    *, tenant: Tenant, weight: Decimal, user: User, request: HttpRequest | None = None
) -> Tenant:
    """Set the organisation's fair-share weight (0.01–100; 1 is everyone's default): its
    share of a shared pool counts divided by it when admission orders equal priorities.
    It applies from the next admission pass on."""
    _require_staff(user)
    if not Decimal("0.01") <= weight <= Decimal("100"):
        raise ServiceError("The weight must be from 0.01 to 100.", field="weight")
    weight = weight.quantize(Decimal("0.01"))
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    before = tenant.fair_share_weight
    if before != weight:
        tenant.fair_share_weight = weight
        tenant.save(update_fields=["fair_share_weight"])
        audit_record(
            action="tenant.fair_share_set",
            tenant=tenant,
            actor=user,
            target=tenant,
            request=request,
            metadata={"from": str(before), "to": str(weight)},
        )
    return tenant
