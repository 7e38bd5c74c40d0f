"""API tokens: made (the raw value shown once, only its hash kept), revoked, and resolved
for each API request."""

from __future__ import annotations

import secrets

from django.db import transaction
from django.http import HttpRequest
from django.utils import timezone

from console.models import ApiToken, Membership, Tenant, User, sha256_hex
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from console.token_lookup import forget_tokens, resolved_token


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
    tenant (no query while it is cached: every API request asks), or None. A staff
    automation token (no tenant) has no membership, and works only while its user is
    staff."""
    if not raw or not raw.startswith(ApiToken.PREFIX):
        return None
    found = resolved_token(sha256_hex(raw))
    if found is None:
        return None
    token, membership = found
    now = timezone.now()
    if (
        token.last_used_at is None
        or (now - token.last_used_at).total_seconds() > LAST_USED_RESOLUTION_SECONDS
    ):
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
        forget_tokens([token.key_hash])  # the kept copy's last use is old now
    return token, membership
