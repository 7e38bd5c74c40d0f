"""Sign-up policy and e-mail verification: who may create an account, and proof of address.

`settings.SIGNUP` says who may create an account: `open` (anyone, after verifying the
address), `invite` (only through an invitation,
`console.services.accounts.signup_with_invitation`, or by staff) or `closed` (staff
only). Open sign-up creates the account inactive: Django's auth backends refuse inactive
users, so neither the sign-in page, the API token endpoint nor a session treat it as
signed in until the link e-mailed here (Django's token generator, its own salt)
activates it, once.

Nothing here tells a caller whether an address already has an account: a sign-up with a
known address e-mails the address's owner and answers exactly like a new one.

An unverified sign-up proves nothing (anyone may type someone else's address), so it
holds nothing back either: a new sign-up for the address replaces it, with everything it
set (`console.services.accounts.unverified_account_discard`), and the link then
activates only with the password of the sign-up it was sent for. Whoever signs up first
with a victim's address can't have the victim activate an account whose password the
first one knows.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib.auth.hashers import make_password
from django.contrib.auth.password_validation import validate_password
from django.contrib.auth.signals import user_login_failed
from django.contrib.auth.tokens import PasswordResetTokenGenerator
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.utils.encoding import force_bytes, force_str
from django.utils.http import urlsafe_base64_decode, urlsafe_base64_encode

from console.models import Tenant, User
from console.service_errors import ErrorCode, ServiceError
from console.services.accounts import (
    awaiting_verification,
    unverified_account_discard,
    unverified_account_locked,
)
from console.services.audit import audit_record
from console.services.mail import email_send_later
from console.services.tenants import tenant_create

OPEN, INVITE, CLOSED = "open", "invite", "closed"

# Builds the absolute URL of a link from its two path parts (uidb64, token).
LinkBuilder = Callable[[str, str], str]

INVALID_LINK = (
    "This verification link is not valid: it has expired, was already used, was replaced "
    "by a later sign-up, or was copied incompletely. Sign in if you verified already; "
    "otherwise sign up again to get a new link."
)
WRONG_PASSWORD = (
    "That is not the password this account was signed up with. If you didn't choose "
    "it, someone else signed up with your address: sign up again with your own password "
    "(that replaces their account) and use the new link."
)


class EmailVerificationTokenGenerator(PasswordResetTokenGenerator):
    """Django's HMAC token (expires after PASSWORD_RESET_TIMEOUT), salted apart from
    password-reset tokens so one can never stand in for the other. It hashes what
    activation and the first sign-in change (`is_active`, `last_login`), so a link works
    once; a new password or e-mail voids it too."""

    key_salt = "console.registration.EmailVerificationTokenGenerator"

    def _make_hash_value(self, user: User, timestamp: int) -> str:
        last_login = (
            "" if user.last_login is None else user.last_login.replace(microsecond=0, tzinfo=None)
        )
        return f"{user.pk}{user.password}{user.is_active}{last_login}{user.email}{timestamp}"


email_verification_tokens = EmailVerificationTokenGenerator()


def signup_open() -> bool:
    return settings.SIGNUP == OPEN


def signup_closed_message() -> str:
    if settings.SIGNUP == INVITE:
        return (
            "Sign-up is by invitation only: ask an owner or admin of your organisation to "
            "invite you, then follow the link in the invitation e-mail."
        )
    return "Sign-up is closed: ask the platform's staff to create your account."


def _verification_mail_send(*, user: User, link_for: LinkBuilder) -> None:
    uidb64 = urlsafe_base64_encode(force_bytes(user.pk))
    link = link_for(uidb64, email_verification_tokens.make_token(user))
    hours = settings.PASSWORD_RESET_TIMEOUT // 3600
    body = (
        f"Welcome to GpuGeek. Confirm that {user.email} is your address to activate your "
        f"account:\n\n{link}\n\nThe link works once and expires in {hours} hours. If you "
        f"did not sign up, ignore this e-mail: without the link no account is activated."
    )
    recipients = [user.email]
    transaction.on_commit(
        lambda: email_send_later(
            subject="Confirm your e-mail address for GpuGeek", body=body, recipients=recipients
        )
    )


def _existing_account_mail_send(*, user: User, sign_in_url: str, reset_url: str) -> None:
    body = (
        f"Someone, perhaps you, tried to create a GpuGeek account for {user.email}. "
        f"This address already has an account, so nothing was created.\n\n"
        f"Sign in: {sign_in_url}\nForgot your password? {reset_url}\n\n"
        f"If it wasn't you, you can ignore this e-mail."
    )
    recipients = [user.email]
    transaction.on_commit(
        lambda: email_send_later(
            subject="Your GpuGeek account already exists", body=body, recipients=recipients
        )
    )


@transaction.atomic
def user_signup(
    *,
    email: str,
    password: str,
    organisation_name: str,
    full_name: str = "",
    verify_link_for: LinkBuilder,
    sign_in_url: str,
    reset_url: str,
    request: HttpRequest | None = None,
) -> tuple[User, Tenant] | None:
    """Open sign-up: a new, inactive person and the organisation they own, plus an e-mail
    with the link that activates the account (`account_verify`).

    An account of the address that still awaits verification is replaced, with all its
    sign-up set (`unverified_account_discard`): the address is the newcomer's to prove.
    Returns None when the address has a verified (or used) account: its owner is
    e-mailed instead and the caller must answer as for a new account, so the page never
    tells who has an account here. Refused unless `settings.SIGNUP` is `open`."""
    if not signup_open():
        raise ServiceError(signup_closed_message(), code=ErrorCode.FORBIDDEN)
    email = User.objects.normalize_email(email).strip().lower()
    # Every check that can fail runs before the address is looked up, so errors look the
    # same for a known and an unknown address.
    try:
        validate_password(password, user=User(email=email, full_name=full_name))
    except ValidationError as error:
        raise ServiceError(" ".join(error.messages), field="password1") from None
    if not organisation_name.strip():
        raise ServiceError("Give the organisation a name.", field="organisation_name")

    unverified = unverified_account_locked(email)
    if unverified is not None:
        unverified_account_discard(user=unverified, request=request)
    existing = User.objects.filter(email__iexact=email).first()
    if existing is None:
        try:
            with transaction.atomic():
                user = User.objects.create_user(
                    email=email, password=password, full_name=full_name, is_active=False
                )
        except IntegrityError:  # a concurrent sign-up won the race; it sends the mail
            return None
        tenant = tenant_create(name=organisation_name, owner=user, request=request)
        audit_record(
            action="user.signed_up", tenant=tenant, actor=user, target=user, request=request
        )
        _verification_mail_send(user=user, link_for=verify_link_for)
        return user, tenant
    make_password(password)  # the new-account path hashes a password: take as long here
    _existing_account_mail_send(user=existing, sign_in_url=sign_in_url, reset_url=reset_url)
    return None


def verification_resend(*, user: User, verify_link_for: LinkBuilder) -> bool:
    """Send the activation link again (the sign-in page does, after a correct password)."""
    if not awaiting_verification(user):
        return False
    _verification_mail_send(user=user, link_for=verify_link_for)
    return True


class UnverifiedSignIn(enum.Enum):
    """What a sign-in with the credentials of an account awaiting verification is."""

    NOT_UNVERIFIED = "not_unverified"  # no such account, a verified one, or locked out
    RIGHT_PASSWORD = "right_password"
    WRONG_PASSWORD = "wrong_password"


def sign_in_awaiting_verification(
    *, request: HttpRequest | None, email: str, password: str
) -> tuple[UnverifiedSignIn, User | None]:
    """Answer a sign-in to an account that awaits verification, before authenticate().

    Django's backends refuse an inactive account like a wrong password, so the right
    password would be logged and counted toward lockout (django-axes) as a failure. Here
    it is told apart: the right password gives the account (the page says "verify your
    address"), a wrong one is recorded as the failed sign-in it is. Anything else
    (unknown address, verified account, a lockout in force) is for authenticate() and
    axes to decide, so the answer reveals nothing the password didn't, and a password is
    hashed once on every path."""
    user = User.objects.filter(email__iexact=(email or "").strip().lower()).first()
    if user is None or not awaiting_verification(user):
        return UnverifiedSignIn.NOT_UNVERIFIED, None
    if request is not None and not AxesProxyHandler.is_allowed(request, {"username": email}):
        return UnverifiedSignIn.NOT_UNVERIFIED, None
    if user.check_password(password):
        return UnverifiedSignIn.RIGHT_PASSWORD, user
    user_login_failed.send(sender=__name__, credentials={"username": email}, request=request)
    return UnverifiedSignIn.WRONG_PASSWORD, None


def verification_link_user(*, uidb64: str, token: str, lock: bool = False) -> User | None:
    """The account a verification link may still activate, or None (used, expired, forged)."""
    try:
        pk = int(force_str(urlsafe_base64_decode(uidb64)))
    except (TypeError, ValueError, OverflowError):
        return None
    users = User.objects.select_for_update() if lock else User.objects.all()
    user = users.filter(pk=pk).first()
    if (
        user is None
        or not awaiting_verification(user)
        or not email_verification_tokens.check_token(user, token)
    ):
        return None
    return user


@transaction.atomic
def account_verify(
    *, uidb64: str, token: str, password: str, request: HttpRequest | None = None
) -> User:
    """Activate the account a verification link names, given the password it was signed
    up with: the link proves the address, the password that the person at it chose the
    account (not someone who signed up with their address). A used, expired, replaced or
    forged link, or another password, is refused with a ServiceError; a wrong password
    leaves the link usable. The row is locked: two clicks activate it once."""
    user = verification_link_user(uidb64=uidb64, token=token, lock=True)
    if user is None:
        raise ServiceError(INVALID_LINK, code=ErrorCode.NOT_FOUND)
    if not user.check_password(password):
        raise ServiceError(WRONG_PASSWORD, field="password")
    user.is_active = True
    user.save(update_fields=["is_active"])
    audit_record(action="user.email_verified", actor=user, target=user, request=request)
    return user
