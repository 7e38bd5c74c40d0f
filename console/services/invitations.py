"""Invitations to an organisation: made by a member who may grant the role, used once by
the invited address, revoked while pending."""

from __future__ import annotations

import secrets
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from console.models import Invitation, Membership, Tenant, User, sha256_hex
from console.permissions import Capability, Role, can_assign_role, has_capability
from console.selectors import membership_of
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.services.mail import email_send_later


def invitation_create(
    *,
    tenant: Tenant,
    by_membership: Membership,
    email: str,
    role: str,
    accept_url_for: Any = None,
    request: HttpRequest | None = None,
) -> tuple[Invitation, str]:
    """Create an invitation; returns it and the raw token (shown once, e-mailed)."""
    email = User.objects.normalize_email(email).strip().lower()
    if role not in Role.values:
        raise ServiceError("Choose a valid role.", field="role")
    if not can_assign_role(by_membership, role):
        raise ServiceError(
            "Only an owner can invite another owner.", code=ErrorCode.FORBIDDEN, field="role"
        )
    if Membership.objects.for_tenant(tenant).filter(user__email__iexact=email).exists():
        raise ServiceError(f"{email} is already a member.", code=ErrorCode.CONFLICT, field="email")
    if Invitation.objects.for_tenant(tenant).pending().filter(email__iexact=email).exists():
        raise ServiceError(
            f"{email} already has a pending invitation; revoke it to send a new one.",
            code=ErrorCode.CONFLICT,
            field="email",
        )
    raw_token = secrets.token_urlsafe(32)
    with transaction.atomic():
        invitation = Invitation.objects.create(
            tenant=tenant,
            email=email,
            role=role,
            token_hash=sha256_hex(raw_token),
            invited_by=by_membership.user,
            expires_at=timezone.now() + settings.INVITATION_TTL,
        )
        audit_record(
            action="invitation.created",
            tenant=tenant,
            actor=by_membership.user,
            target=invitation,
            request=request,
            metadata={"email": email, "role": role},
        )
    if accept_url_for is not None:
        link = accept_url_for(raw_token)
        subject = f"You are invited to {tenant.name} on GpuGeek"
        body = (
            f"{by_membership.user.display_name} invited you to join {tenant.name} as "
            f"{invitation.get_role_display()}.\n\nAccept: {link}\n\n"
            f"The link works once and expires on {invitation.expires_at:%Y-%m-%d %H:%M} UTC."
        )
        transaction.on_commit(
            lambda: email_send_later(subject=subject, body=body, recipients=[email])
        )
    return invitation, raw_token


def invitation_for_token(raw_token: str) -> Invitation:
    """The pending invitation behind a link, or a ServiceError saying why it can't be used."""
    invitation = (
        Invitation.objects.select_related("tenant", "invited_by")
        .filter(token_hash=sha256_hex(raw_token or ""))
        .first()
    )
    if invitation is None:
        raise ServiceError("This invitation link is not valid.", code=ErrorCode.NOT_FOUND)
    state = invitation.state
    if state == "accepted":
        raise ServiceError("This invitation has already been used.", code=ErrorCode.CONFLICT)
    if state == "revoked":
        raise ServiceError(
            "This invitation was revoked. Ask for a new one.", code=ErrorCode.CONFLICT
        )
    if state == "expired":
        raise ServiceError(
            "This invitation has expired. Ask for a new one.", code=ErrorCode.CONFLICT
        )
    if not _inviter_may_grant(invitation):
        raise ServiceError(
            f"This invitation is no longer valid: the person who sent it can no longer add "
            f"members to {invitation.tenant.name} as {invitation.get_role_display()}. Ask an "
            "owner or admin there for a new one.",
            code=ErrorCode.FORBIDDEN,
        )
    return invitation


def _inviter_may_grant(invitation: Invitation) -> bool:
    """Whether the invitation's sender may still grant its role in its tenant (checked when
    it is used: a member removed or demoted since can't have let someone in meanwhile).
    Platform staff, who may add anyone, are not members of the tenants they help."""
    inviter = invitation.invited_by
    if inviter is None or not inviter.is_active:
        return False
    if inviter.is_staff:
        return True
    membership = membership_of(user=inviter, tenant=invitation.tenant)
    return has_capability(membership, Capability.MANAGE_MEMBERS) and can_assign_role(
        membership, invitation.role
    )


@transaction.atomic
def invitation_accept(
    *, raw_token: str, user: User, request: HttpRequest | None = None
) -> Membership:
    invitation = invitation_for_token(raw_token)
    # Lock the row: two clicks on one link must not make two memberships or reuse it.
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    if invitation.state != "pending":
        raise ServiceError("This invitation has already been used.", code=ErrorCode.CONFLICT)
    if invitation.email.lower() != user.email.lower():
        raise ServiceError(
            f"This invitation is for {invitation.email}; you are signed in as {user.email}.",
            code=ErrorCode.FORBIDDEN,
        )
    membership, created = Membership.objects.get_or_create(
        tenant=invitation.tenant, user=user, defaults={"role": invitation.role}
    )
    invitation.accepted_at = timezone.now()
    invitation.accepted_by = user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    audit_record(
        action="membership.joined" if created else "invitation.accepted",
        tenant=invitation.tenant,
        actor=user,
        target=membership,
        request=request,
        metadata={"role": membership.role, "invitation": invitation.pk},
    )
    return membership


@transaction.atomic
def invitation_revoke(
    *, invitation: Invitation, by_user: User, request: HttpRequest | None = None
) -> Invitation:
    if invitation.state != "pending":
        return invitation  # revoking a used, expired or revoked invitation changes nothing
    invitation.revoked_at = timezone.now()
    invitation.save(update_fields=["revoked_at"])
    audit_record(
        action="invitation.revoked",
        tenant=invitation.tenant,
        actor=by_user,
        target=invitation,
        request=request,
        metadata={"email": invitation.email},
    )
    return invitation
