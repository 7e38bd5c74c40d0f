"""Accounts: an address not yet verified, and joining through an invitation. Open sign-up
and its verification link are `console.registration`'s."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest

from console.models import Membership, Tenant, User
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.services.invitations import invitation_accept, invitation_for_token


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
