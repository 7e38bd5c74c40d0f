"""Members' roles and their removal. An organisation keeps at least one owner, counted
under a lock on its row."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from console.models import ApiToken, Invitation, Membership, Tenant
from console.permissions import Role, can_assign_role
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.signals import membership_changed


def _owner_count(tenant: Tenant) -> int:
    """Owners of the tenant, counted under a lock on the tenant row, so two owners
    demoting or removing each other at once can't leave it with none."""
    Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
    return Membership.objects.for_tenant(tenant).filter(role=Role.OWNER).count()


@transaction.atomic
def membership_change_role(
    *,
    membership: Membership,
    role: str,
    by_membership: Membership,
    request: HttpRequest | None = None,
) -> Membership:
    if role not in Role.values:
        raise ServiceError("Choose a valid role.", field="role")
    membership = Membership.objects.select_for_update().get(pk=membership.pk)
    if membership.role == role:
        return membership
    if not can_assign_role(by_membership, role) or not can_assign_role(
        by_membership, membership.role
    ):
        raise ServiceError(
            "Only an owner can change an owner's role or make an owner.", code=ErrorCode.FORBIDDEN
        )
    if membership.role == Role.OWNER and _owner_count(membership.tenant) <= 1:
        raise ServiceError(
            "An organisation needs at least one owner; make someone else owner first.",
            code=ErrorCode.CONFLICT,
        )
    previous = membership.role
    membership.role = role
    membership.save(update_fields=["role"])
    audit_record(
        action="membership.role_changed",
        tenant=membership.tenant,
        actor=by_membership.user,
        target=membership,
        request=request,
        metadata={"from": previous, "to": role, "user": membership.user.email},
    )
    # Their open sockets check again whether the new role still lets them watch.
    membership_changed.send(
        sender=Membership, tenant_id=membership.tenant_id, user_id=membership.user_id
    )
    return membership


@transaction.atomic
def membership_remove(
    *, membership: Membership, by_membership: Membership, request: HttpRequest | None = None
) -> None:
    """Remove a member (or leave, when by_membership is the same). Their tokens stop
    working, their pending invitations are revoked, and their open sockets close."""
    membership = Membership.objects.select_for_update().get(pk=membership.pk)
    leaving = membership.pk == by_membership.pk
    if not leaving and not can_assign_role(by_membership, membership.role):
        raise ServiceError("Only an owner can remove an owner.", code=ErrorCode.FORBIDDEN)
    if membership.role == Role.OWNER and _owner_count(membership.tenant) <= 1:
        raise ServiceError(
            "The last owner can't be removed; make someone else owner first.",
            code=ErrorCode.CONFLICT,
        )
    now = timezone.now()
    ApiToken.objects.for_tenant(membership.tenant).active().filter(user=membership.user).update(
        revoked_at=now
    )
    audit_record(
        action="membership.left" if leaving else "membership.removed",
        tenant=membership.tenant,
        actor=by_membership.user,
        target=membership,
        request=request,
        metadata={"user": membership.user.email, "role": membership.role},
    )
    invitations = Invitation.objects.for_tenant(membership.tenant).pending()
    for invitation in invitations.filter(invited_by=membership.user).select_for_update():
        invitation.revoked_at = now
        invitation.save(update_fields=["revoked_at"])
        audit_record(
            action="invitation.revoked",
            tenant=membership.tenant,
            actor=by_membership.user,
            target=invitation,
            request=request,
            metadata={"email": invitation.email, "reason": "inviter no longer a member"},
        )
    membership_changed.send(
        sender=Membership, tenant_id=membership.tenant_id, user_id=membership.user_id
    )
    membership.delete()
