"""SSH public keys of a person: added (validated by console.ssh_public_keys, at most
MAX_KEYS_PER_USER, never the same key twice) and deleted, each step in the audit log.

The keys are the user's, not an organisation's: audit events carry no tenant, like a
password change."""

from __future__ import annotations

from django.db import IntegrityError, transaction
from django.http import HttpRequest

from console.models import SshPublicKey, User
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.ssh_public_keys import parse_public_key

MAX_KEYS_PER_USER = 50
MAX_TITLE_LENGTH = 100


def _duplicate(key: SshPublicKey) -> ServiceError:
    return ServiceError(
        f"You added this key already, as “{key.title}” ({key.fingerprint}).",
        code=ErrorCode.CONFLICT,
        field="public_key",
    )


def ssh_key_add(
    *, user: User, public_key: str, title: str = "", request: HttpRequest | None = None
) -> SshPublicKey:
    """Store `public_key` (one line as in a .pub file) for `user`. `title` defaults to
    the key's comment, else its type and the start of its fingerprint."""
    parsed = parse_public_key(public_key)
    title = " ".join((title or "").split())
    if len(title) > MAX_TITLE_LENGTH:
        raise ServiceError(f"Keep the title under {MAX_TITLE_LENGTH} characters.", field="title")
    title = (
        title
        or parsed.comment[:MAX_TITLE_LENGTH]
        or (f"{parsed.label} key {parsed.fingerprint[7:15]}")
    )
    with transaction.atomic(durable=True):
        # The user's row is the lock that makes the count and the duplicate check exact
        # when two requests add keys at once.
        User.objects.select_for_update().filter(pk=user.pk).first()
        keys = SshPublicKey.objects.filter(user=user)
        existing = keys.filter(fingerprint=parsed.fingerprint).first()
        if existing is not None:
            raise _duplicate(existing)
        if keys.count() >= MAX_KEYS_PER_USER:
            raise ServiceError(
                f"You have {MAX_KEYS_PER_USER} SSH keys, the most one account may hold. "
                "Delete one you no longer use first.",
                code=ErrorCode.CONFLICT,
            )
        try:
            with transaction.atomic():
                key = SshPublicKey.objects.create(
                    user=user,
                    title=title,
                    key_type=parsed.key_type,
                    bits=parsed.bits,
                    public_key=parsed.public_key,
                    comment=parsed.comment,
                    fingerprint=parsed.fingerprint,
                )
        except IntegrityError:
            # SQLite doesn't lock rows: a concurrent add of the same key lands here.
            raise _duplicate(keys.get(fingerprint=parsed.fingerprint)) from None
        audit_record(
            action="ssh_key.added",
            actor=user,
            target=key,
            request=request,
            metadata={"title": key.title, "key_type": key.key_type, "fingerprint": key.fingerprint},
        )
    return key


def ssh_key_delete(*, key: SshPublicKey, request: HttpRequest | None = None) -> None:
    """Delete one of a person's keys (the caller looked it up among that person's own).
    Environments stop accepting it when they next write their authorized_keys."""
    with transaction.atomic(durable=True):
        audit_record(
            action="ssh_key.removed",
            actor=key.user,
            target=key,
            request=request,
            metadata={"title": key.title, "key_type": key.key_type, "fingerprint": key.fingerprint},
        )
        key.delete()
