"""`Authorization: Bearer <token>` for scripts and CI; the token fixes the tenant (none
for a staff automation token, which reaches the staff endpoints only)."""

from __future__ import annotations

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from console.services.tokens import api_token_authenticate


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        raw = raw.strip()
        if not raw or " " in raw:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        found = api_token_authenticate(raw)
        if found is None:
            # Unknown, revoked or expired, or its user is no longer a member.
            raise exceptions.AuthenticationFailed("Invalid or revoked API token.")
        token, membership = found
        # The request's tenant is the token's, whatever the session says (a staff
        # token's is None: it is refused by every tenant-scoped view).
        request._request.tenant = token.tenant
        request._request.membership = membership
        return token.user, token

    def authenticate_header(self, request) -> str:
        return f'{self.keyword} realm="api"'


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}
