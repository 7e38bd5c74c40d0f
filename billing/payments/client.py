"""The Stripe client, configured from settings, and the errors that mean "try later".

`STRIPE_API_BASE` points the real `stripe` library elsewhere (tests run it against a
local Stripe-like server). The library's own network retries are off: our callers retry
(the Celery task with backoff, the user's next click) with the same stored idempotency
keys, which is what makes a retry after a timeout safe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import stripe
from django.conf import settings

T = TypeVar("T")


class StripeUnavailable(Exception):
    """Stripe could not be reached or answered with a server error: retry later, with
    the same idempotency keys."""


class StripeRefused(Exception):
    """Stripe refused the request (bad parameters, key, idempotency conflict): retrying
    the same request won't help; someone must look."""


# A timeout, a refused connection, 429, or a 5xx (409 "key in use" included): transient.
TRANSIENT = (stripe.APIConnectionError, stripe.RateLimitError, stripe.APIError)


def stripe_configured() -> bool:
    return bool(settings.STRIPE_API_KEY)


def stripe_client() -> stripe.StripeClient:
    return stripe.StripeClient(
        settings.STRIPE_API_KEY or "",
        base_addresses={"api": settings.STRIPE_API_BASE},
        max_network_retries=0,
        http_client=stripe.RequestsClient(timeout=settings.STRIPE_TIMEOUT),
    )


def stripe_call(call: Callable[[stripe.StripeClient], T]) -> T:
    """Run one Stripe request, turning the library's errors into ours."""
    try:
        return call(stripe_client())
    except TRANSIENT as error:
        raise StripeUnavailable(_describe(error)) from error
    except stripe.StripeError as error:
        raise StripeRefused(_describe(error)) from error


def _describe(error: stripe.StripeError) -> str:
    status = f"HTTP {error.http_status}: " if error.http_status else ""
    return f"{type(error).__name__}: {status}{error.user_message or error}"[:500]


def idempotency_key(*parts: object) -> str:
    """A key derived from our own identifiers, prefixed with this installation's id so
    two consoles sharing one Stripe account never answer each other's requests."""
    return ":".join(["gpugeek", settings.GPUGEEK_INSTALLATION_ID, *map(str, parts)])[:255]


def installation_metadata() -> dict[str, str]:
    """Metadata on everything we create at Stripe: webhooks of an account reach every
    console that shares it, and each must recognise only its own objects."""
    return {"gpugeek_installation": settings.GPUGEEK_INSTALLATION_ID}


def is_ours(metadata: dict | None) -> bool:
    return (metadata or {}).get("gpugeek_installation") == settings.GPUGEEK_INSTALLATION_ID
