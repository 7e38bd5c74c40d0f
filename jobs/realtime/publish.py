"""Publishing: each live update is built by its one builder (messages) and sent by the
one sender (sender). Sends tied to a database change happen after the transaction
commits."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction

from jobs.models import Job
from jobs.realtime import messages
from jobs.realtime.messages import LogLinePayload, MetricSamplePayload, job_group, tenant_group
from jobs.realtime.sender import asend_to_group, send_many, send_to_group, send_to_groups


def _status_for_groups(job: Job) -> tuple[list[str], messages.JobStatusMessage]:
    return [job_group(job.pk), tenant_group(job.tenant_id)], messages.job_status_message(job)


def publish_job_status(job: Job) -> None:
    groups, message = _status_for_groups(job)
    transaction.on_commit(lambda: send_to_groups(groups, message))


def publish_jobs_status(jobs: list[Job]) -> None:
    """`publish_job_status` for many jobs, sent together after commit."""
    batch = [_status_for_groups(job) for job in jobs]
    transaction.on_commit(lambda: send_many(list(batch)))


async def apublish_job_logs(
    job_id: int, lines: list[LogLinePayload], last_line: int | None = None
) -> None:
    """A batch of log lines (the job's log follower, in the ASGI process)."""
    await asend_to_group(job_group(job_id), messages.job_log_message(job_id, lines, last_line))


def publish_job_metrics(
    job_id: int, tenant_id: int, samples: list[MetricSamplePayload], note: str = ""
) -> None:
    """New samples of one job: to the job page, and a summary to the tenant's job list."""
    message = messages.job_metrics_message(job_id, samples, note)
    summary = messages.job_metrics_summary_message(job_id, samples)

    def send() -> None:
        send_to_group(job_group(job_id), message)
        if samples:
            send_to_group(tenant_group(tenant_id), summary)

    transaction.on_commit(send)


def publish_job_alert(job: Job, *, kind: str, severity: str, message: str, at: datetime) -> None:
    payload = messages.job_alert_message(
        job.pk, kind=kind, severity=severity, message=message, at=at
    )
    groups = [job_group(job.pk), tenant_group(job.tenant_id)]
    transaction.on_commit(lambda: send_to_groups(groups, payload))


def publish_budget_alert(
    *,
    tenant_id: int,
    budget: str,
    amount: Decimal,
    currency: str,
    threshold: int,
    kind: str,
    spend: Decimal,
) -> None:
    """A budget threshold crossed (billing's enforcement), for every open page of the
    tenant."""
    payload = messages.budget_alert_message(
        budget=budget, amount=amount, currency=currency, threshold=threshold, kind=kind,
        spend=spend,
    )  # fmt: skip
    transaction.on_commit(lambda: send_to_group(tenant_group(tenant_id), payload))


def publish_membership_changed(*, tenant_id: int, user_id: int) -> None:
    """After the current transaction commits, tell the person's open sockets on this
    organisation to check their access again (connected to console's
    `membership_changed` signal by jobs.receivers: console can't import jobs)."""
    payload = messages.membership_changed_message(tenant_id=tenant_id, user_id=user_id)
    group = messages.membership_group(tenant_id, user_id)
    transaction.on_commit(lambda: send_to_group(group, payload))
