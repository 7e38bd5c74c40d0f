"""The resolved API token every API request asks for (token → user, organisation and
the user's membership there), kept in Django's cache (console.caching) and dropped when
the token, its user, its organisation or the membership changes (console.signals)."""

from __future__ import annotations

from console.caching import cached, forget
from console.models import ApiToken, Membership

# Short: a request that read the token just before a revocation committed could keep it
# this long at worst (the change's own drop after commit clears every other case).
TOKEN_KEPT_SECONDS = 60


def token_cache_key(key_hash: str) -> str:
    return f"api-token:{key_hash}"


def resolved_token(key_hash: str) -> tuple[ApiToken, Membership | None] | None:
    """The active token with this hash and its user's membership of the token's active
    organisation; a staff automation token (no organisation) with no membership while its
    user is staff; or None. From the cache when it has it (no query)."""
    return cached(token_cache_key(key_hash), TOKEN_KEPT_SECONDS, lambda: _resolve(key_hash))


def _resolve(key_hash: str) -> tuple[ApiToken, Membership | None] | None:
    token = (
        ApiToken.objects.active()
        .select_related("user", "tenant")
        .filter(key_hash=key_hash, user__is_active=True)
        .first()
    )
    if token is None:
        return None
    if token.tenant is None:
        return (token, None) if token.user.is_staff else None
    if not token.tenant.is_active:
        return None
    membership = Membership.objects.for_tenant(token.tenant).filter(user=token.user).first()
    if membership is None:
        return None
    membership.user, membership.tenant = token.user, token.tenant
    return token, membership


def forget_tokens(key_hashes) -> None:
    forget(token_cache_key(key_hash) for key_hash in key_hashes)
