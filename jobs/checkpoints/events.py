"""The `checkpoint` event a job posts after writing a manifest: its capability.

A job holds no console token. The console hands each job a token of its own (signed
with the installation's SECRET_KEY, naming only that tenant and job) and the URL to post
it to; the token proves nothing but "this is job N", and the event only asks the console
to look at that job's prefix now instead of at its next scan: what gets recorded is what
the console itself finds complete in the store.
"""

from __future__ import annotations

import ipaddress
from datetime import datetime, timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core import signing
from django.urls import reverse

_SALT = "gpugeek.jobs.checkpoint-event"

# Each event lists the job's store prefix (and may delete from it), so a job looping on
# the endpoint must not turn into load on the console and the store: a burst of
# EVENT_BURST events, then one per EVENT_INTERVAL (a generic cell rate). Checkpoints
# saved faster than that are still recorded and pruned, by the periodic scan.
EVENT_INTERVAL = timedelta(seconds=5)
EVENT_BURST = 10


def checkpoint_event_turn(*, due_at: datetime | None, now: datetime) -> datetime | None:
    """The job's next `due_at` if an event now is within the rate, else None. `due_at`
    is when the next event would be due at the sustained rate (None: never posted)."""
    due = max(due_at or now, now)
    if due - now > EVENT_INTERVAL * (EVENT_BURST - 1):
        return None
    return due + EVENT_INTERVAL


def checkpoint_event_retry_after(*, due_at: datetime, now: datetime) -> float:
    """Seconds until an event would be within the rate again."""
    return max((due_at - EVENT_INTERVAL * (EVENT_BURST - 1) - now).total_seconds(), 0.0)


def _signer() -> signing.Signer:
    return signing.Signer(salt=_SALT, algorithm="sha256")


def checkpoint_event_token(*, tenant_id: int, job_id: int) -> str:
    """The job's token: deterministic, so every start (and a redelivered one) gets the
    same, and a Kubernetes Secret rendered twice is the same Secret."""
    return _signer().sign(f"{int(tenant_id)}.{int(job_id)}")


def checkpoint_event_job(token: str) -> tuple[int, int] | None:
    """(tenant id, job id) the token was made for, or None when it isn't one of ours."""
    try:
        tenant_text, _, job_text = _signer().unsign(token).partition(".")
        return int(tenant_text), int(job_text)
    except (signing.BadSignature, ValueError):
        return None


def checkpoint_event_environment(*, tenant_id: int, job_id: int) -> dict[str, str]:
    """GPUGEEK_CHECKPOINT_NOTIFY_URL and GPUGEEK_CHECKPOINT_TOKEN, when the console has a
    URL jobs can reach (CONSOLE_URL_FOR_JOBS); without one the periodic scan still
    records the checkpoints."""
    base = (settings.CONSOLE_URL_FOR_JOBS or "").rstrip("/")
    if not base:
        return {}
    path = reverse("api-job-checkpoint-events", kwargs={"pk": int(job_id)})
    return {
        "GPUGEEK_CHECKPOINT_NOTIFY_URL": f"{base}{path}",
        "GPUGEEK_CHECKPOINT_TOKEN": checkpoint_event_token(tenant_id=tenant_id, job_id=job_id),
    }


def _sdks_fetch_credentials_from(url: str) -> bool:
    """AWS SDKs fetch container credentials only over HTTPS or from a loopback address
    (plain HTTP elsewhere could hand them to anyone on the path)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return True
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


def checkpoint_credentials_environment(*, tenant_id: int, job_id: int) -> dict[str, str]:
    """Where the job renews its temporary store credentials, in the variables of the AWS
    SDKs' container-credentials provider (boto3, the AWS CLI, s5cmd and the other SDKs
    fetch and renew from it on their own), authenticated by the job's token; {} when the
    console has no URL jobs reach in a way those SDKs accept."""
    base = (settings.CONSOLE_URL_FOR_JOBS or "").rstrip("/")
    if not base or not _sdks_fetch_credentials_from(base):
        return {}
    path = reverse("api-job-checkpoint-credentials", kwargs={"pk": int(job_id)})
    token = checkpoint_event_token(tenant_id=tenant_id, job_id=job_id)
    return {
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": f"{base}{path}",
        "AWS_CONTAINER_AUTHORIZATION_TOKEN": f"Bearer {token}",
    }
