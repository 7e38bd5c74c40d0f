"""Writes for accounts and tenancy. Views and API views call these; nothing else writes.

Every service that changes membership or credentials records an audit event in the same
transaction, so the log can't miss a change that happened.
"""

from __future__ import annotations

import logging
import secrets
from typing import Any

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone
from django.utils.text import slugify

from console import tasks
from console.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    Notification,
    Tenant,
    User,
    sha256_hex,
)
from console.permissions import Capability, Role, can_assign_role, has_capability
from console.queueing import enqueue_now
from console.realtime import publish_membership_changed
from console.selectors import membership_of
from console.service_errors import ErrorCode, ServiceError
from console.token_lookup import organisation_token

logger = logging.getLogger(__name__)


# --- audit ----


def client_ip(request: HttpRequest | None) -> str | None:
    if request is None:
        return None
    proxies = getattr(settings, "AXES_IPWARE_PROXY_COUNT", None)
    if proxies:
        forwarded = [p.strip() for p in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [p for p in forwarded if p]
        if len(forwarded) >= proxies:
            return forwarded[-proxies]
    return request.META.get("REMOTE_ADDR") or None


def audit_record(
    *,
    action: str,
    tenant: Tenant | None = None,
    actor: User | None = None,
    actor_label: str | None = None,
    target: Any = None,
    request: HttpRequest | None = None,
    metadata: dict | None = None,
) -> AuditEvent:
    request_user = getattr(request, "user", None)
    if actor is None and request_user is not None and request_user.is_authenticated:
        actor = request_user
    return AuditEvent.objects.create(
        tenant=tenant,
        actor=actor,
        actor_label=actor_label or (actor.email if actor else "system"),
        action=action,
        target_type=target._meta.model_name if target is not None else "",
        target_id=str(target.pk) if target is not None else "",
        target_repr=str(target)[:200] if target is not None else "",
        ip_address=client_ip(request),
        metadata=metadata or {},
    )


def email_send_later(*, subject: str, body: str, recipients: list[str]) -> bool:
    """Queue an e-mail for the worker. A broker outage must not fail the page that
    triggered it (the invitation link is also shown on screen), so it is logged instead."""
    return enqueue_now(tasks.send_email_task, subject, body, recipients)


# --- tenants and sign-up ----


def _unique_slug(name: str) -> str:
    base = slugify(name)[:50] or "org"
    slug, n = base, 1
    while Tenant.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


@transaction.atomic
def tenant_create(
    *, name: str, owner: User, slug: str | None = None, request: HttpRequest | None = None
) -> Tenant:
    name = name.strip()
    if not name:
        raise ServiceError("Give the organisation a name.", field="name")
    if slug and Tenant.objects.filter(slug=slug).exists():
        raise ServiceError(f"The slug “{slug}” is taken.", code=ErrorCode.CONFLICT, field="slug")
    tenant = Tenant.objects.create(name=name, slug=slug or _unique_slug(name))
    Membership.objects.create(tenant=tenant, user=owner, role=Role.OWNER)
    audit_record(
        action="tenant.created", tenant=tenant, actor=owner, target=tenant, request=request
    )
    return tenant


def awaiting_verification(user: User) -> bool:
    """Inactive and never signed in: an open sign-up whose address isn't verified yet.
    (An account staff deactivated after it was used has a `last_login`.)"""
    return not user.is_active and user.last_login is None


def unverified_account_locked(email: str) -> User | None:
    """The account of `email` if it still awaits verification, locked until the caller's
    transaction ends (two sign-ups for one address replace it once)."""
    user = User.objects.select_for_update().filter(email__iexact=email).first()
    return user if user is not None and awaiting_verification(user) else None


def unverified_account_discard(*, user: User, request: HttpRequest | None = None) -> None:
    """Delete an account whose address was never verified, and everything its sign-up
    set, so that whoever proves the address next (a new sign-up, an invitation) starts
    from nothing of it.

    An unverified sign-up proves nothing: anyone may sign up with someone else's address.
    Its password, name, API tokens, notifications and memberships go with the row; its
    sessions are dead with it (a session names its user; none can exist anyway, as it
    never signed in); the organisations no one else belongs to (the one its sign-up
    made; nobody could add to it without signing in) are deleted. An organisation with
    other members keeps them and only loses this one. Audited without the tenant, so the
    record outlives what it names."""
    if not awaiting_verification(user):
        raise ValueError("Only an account that never verified its address is discarded.")
    own = Membership.objects.filter(user=user).values("tenant_id")
    shared = Membership.objects.filter(tenant_id__in=own).exclude(user=user).values("tenant_id")
    organisations = Tenant.objects.filter(pk__in=own).exclude(pk__in=shared)
    audit_record(
        action="user.unverified_discarded",
        actor_label="sign-up",
        target=user,
        request=request,
        metadata={"organisations": sorted(organisations.values_list("name", flat=True))},
    )
    organisations.delete()
    user.delete()


def _validate_new_user(email: str, password: str) -> str:
    email = User.objects.normalize_email(email).strip().lower()
    if User.objects.filter(email__iexact=email).exists():
        raise ServiceError(
            "An account with this e-mail already exists. Sign in instead.",
            code=ErrorCode.CONFLICT,
            field="email",
        )
    try:
        validate_password(password, user=User(email=email))
    except ValidationError as error:
        raise ServiceError(" ".join(error.messages), field="password1") from None
    return email


# --- invitations ----


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
def signup_with_invitation(
    *, raw_token: str, password: str, full_name: str = "", request: HttpRequest | None = None
) -> tuple[User, Membership]:
    """A new person joining through an invitation (no organisation of their own).

    The invitation proves the address, so the account is active at once. Refused when
    sign-up is `closed` (`console.registration`): then only staff create accounts."""
    if settings.SIGNUP == "closed":
        raise ServiceError(
            "Sign-up is closed: ask the platform's staff to create your account, then "
            "sign in and follow this link again.",
            code=ErrorCode.FORBIDDEN,
        )
    invitation = invitation_for_token(raw_token)
    # The invitation reached the address: an unverified sign-up for it (anyone's) yields.
    # (A refusal below rolls the discard back with the rest.)
    unverified = unverified_account_locked(invitation.email)
    if unverified is not None:
        unverified_account_discard(user=unverified, request=request)
    email = _validate_new_user(invitation.email, password)
    user = User.objects.create_user(email=email, password=password, full_name=full_name)
    audit_record(
        action="user.signed_up", tenant=invitation.tenant, actor=user, target=user, request=request
    )
    return user, invitation_accept(raw_token=raw_token, user=user, request=request)


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


# --- memberships ----


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
    publish_membership_changed(tenant_id=membership.tenant_id, user_id=membership.user_id)
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
    publish_membership_changed(tenant_id=membership.tenant_id, user_id=membership.user_id)
    membership.delete()


# --- API tokens ----


@transaction.atomic
def api_token_create(
    *, user: User, tenant: Tenant | None, name: str, request: HttpRequest | None = None
) -> tuple[ApiToken, str]:
    """Create a token; the raw value is returned once and never stored. Without a
    tenant: a staff automation token, for platform staff only."""
    name = (name or "").strip()
    if not name:
        raise ServiceError("Give the token a name, e.g. “ci-pipeline”.", field="name")
    if len(name) > 100:
        raise ServiceError("Keep the name under 100 characters.", field="name")
    if tenant is None:
        if not user.is_staff:
            raise ServiceError(
                "You are not a member of any organisation.", code=ErrorCode.FORBIDDEN
            )
    elif not Membership.objects.for_tenant(tenant).filter(user=user).exists():
        raise ServiceError("You are not a member of this organisation.", code=ErrorCode.FORBIDDEN)
    raw = ApiToken.PREFIX + secrets.token_urlsafe(32)
    token = ApiToken.objects.create(
        tenant=tenant, user=user, name=name, prefix=raw[:12], key_hash=sha256_hex(raw)
    )
    audit_record(
        action="api_token.created",
        tenant=tenant,
        actor=user,
        target=token,
        request=request,
        metadata={"name": name, "prefix": token.prefix},
    )
    return token, raw


@transaction.atomic
def api_token_revoke(
    *, token: ApiToken, by_user: User, request: HttpRequest | None = None
) -> ApiToken:
    if token.revoked_at is not None:
        return token  # already revoked: nothing changes, nothing to log
    token.revoked_at = timezone.now()
    token.save(update_fields=["revoked_at"])
    audit_record(
        action="api_token.revoked",
        tenant=token.tenant,
        actor=by_user,
        target=token,
        request=request,
        metadata={"name": token.name, "owner": token.user.email},
    )
    return token


# Writing last_used_at on every request would make each API call a write.
LAST_USED_RESOLUTION_SECONDS = 60


def api_token_authenticate(raw: str) -> tuple[ApiToken, Membership | None] | None:
    """The active token with this value and its user's membership of the token's
    tenant (one query: every API request pays for it), or None. A staff automation
    token (no tenant) has no membership, and works only while its user is staff: it is
    looked for second, as an OR of both kinds in one query costs every request more."""
    if not raw or not raw.startswith(ApiToken.PREFIX):
        return None
    key_hash = sha256_hex(raw)
    found = organisation_token(key_hash)
    token, membership = found if found else (None, None)
    if token is None:
        token = (
            ApiToken.objects.active()
            .select_related("user")
            .filter(
                key_hash=key_hash, tenant__isnull=True, user__is_active=True, user__is_staff=True
            )
            .first()
        )
    if token is None:
        return None
    now = timezone.now()
    if (
        token.last_used_at is None
        or (now - token.last_used_at).total_seconds() > LAST_USED_RESOLUTION_SECONDS
    ):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token, membership


# --- notifications ----


def notify(
    *,
    tenant: Tenant,
    user: User | None,
    title: str,
    body: str = "",
    url: str = "",
    level: str = "info",
    email: bool = True,
) -> None:
    """In-app notification, plus an e-mail (queued after commit) when asked."""
    if user is None or not user.is_active:
        return
    Notification.objects.create(
        tenant=tenant, user=user, title=title[:200], body=body, url=url[:300], level=level
    )
    if email:
        transaction.on_commit(
            lambda: email_send_later(
                subject=f"[GpuGeek] {title}",
                body=f"{body}\n\n{url}".strip(),
                recipients=[user.email],
            )
        )


def notifications_mark_read(*, user: User, tenant: Tenant, notification_id: int | None = None):
    unread = Notification.objects.for_tenant(tenant).filter(user=user).unread()
    if notification_id is not None:
        unread = unread.filter(pk=notification_id)
    return unread.update(read_at=timezone.now())
