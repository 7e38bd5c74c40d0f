"""What a request's headers say about its client: the address, behind a known number of
proxies (`AXES_IPWARE_PROXY_COUNT`). Audit records and django-axes' lockouts both read it
(settings' `AXES_CLIENT_IP_CALLABLE`)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


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
