"""Every message the live channels carry, one `TypedDict` each with its `type`, and the
one function that builds each; the groups they go to; how a log batch is cut into
WebSocket messages.

Groups: `job.<id>` (a job's page: status, logs, metrics, alerts), `tenant.<id>` (the
tenant's pages: job list updates, alerts, budget alerts), `membership.<tenant>.<user>`
(one person's sockets in one organisation: access changed).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal
from typing import Literal, NotRequired, TypedDict

from jobs.models import Job, JobStatus


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


def membership_group(tenant_id: int, user_id: int) -> str:
    """The group of one person's sockets on one organisation's pages."""
    return f"membership.{tenant_id}.{user_id}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# Status changes the job's charts mark (a vertical line with this label), by the status
# entered: the page draws earlier ones from the job's events and new ones from the status
# message, both through this one rule.
CHART_MARKERS: dict[str, str] = {
    JobStatus.PAUSED: "Paused",
    JobStatus.RESUMING: "Resumed",
    JobStatus.PREEMPTED: "Preempted",
}


# --- payloads (what the browser receives, JSON) -------------------------------------------


class JobStatusMessage(TypedDict):
    type: Literal["status"]
    job_id: int
    status: str
    status_reason: str
    attempt: int
    at: str
    is_finished: bool
    marker: str  # the label the job's charts mark this change with, "" for none


class LogLinePayload(TypedDict):
    line_no: int  # 1-based, global per job (across ranks)
    rank: int
    text: str
    ts: str  # when the server read the line (ISO 8601)


class JobLogMessage(TypedDict):
    type: Literal["log"]
    job_id: int
    lines: list[LogLinePayload]
    # The store holds at least this many lines (a follower's first message may carry no
    # lines, only this): a socket that has sent less fills the gap from the store.
    last_line: NotRequired[int]


class MetricSamplePayload(TypedDict):
    at: str
    node: str
    gpu: int
    utilization: float | None  # %
    memory_used_mib: float | None
    memory_total_mib: float | None
    power_w: float | None
    temperature_c: float | None


class JobMetricsMessage(TypedDict):
    type: Literal["metrics"]
    job_id: int
    samples: list[MetricSamplePayload]
    note: NotRequired[str]  # e.g. "no GPU": why there are no samples


class JobMetricsSummaryMessage(TypedDict):
    """What the tenant's job list gets per tick: enough for a utilisation sparkline."""

    type: Literal["metrics"]
    job_id: int
    at: str
    utilization: float | None  # mean over the job's GPUs


class JobAlertMessage(TypedDict):
    type: Literal["alert"]
    job_id: int
    kind: str  # utilization_unstable | memory_leak | loss_explosion | gpu_idle
    severity: str  # warning | critical
    message: str
    at: str


class BudgetAlertMessage(TypedDict):
    """A budget threshold crossed: every page of the tenant shows `message` like any
    alert, with the budget's figures beside it."""

    type: Literal["alert"]
    scope: Literal["budget"]
    budget: str
    threshold: int  # %
    kind: str  # actual | forecast
    spend: str  # Decimal, as text
    amount: str
    severity: str
    message: str
    at: str


MEMBERSHIP_CHANGED = "membership_changed"


class MembershipChangedMessage(TypedDict):
    """Never shown: the person's sockets check their access again (and close if gone)."""

    type: Literal["membership_changed"]
    tenant_id: int
    user_id: int


RealtimeMessage = (
    JobStatusMessage
    | JobLogMessage
    | JobMetricsMessage
    | JobMetricsSummaryMessage
    | JobAlertMessage
    | BudgetAlertMessage
    | MembershipChangedMessage
)


# --- builders: one per payload -------------------------------------------------------------


def job_status_message(job: Job) -> JobStatusMessage:
    return JobStatusMessage(
        type="status",
        job_id=job.pk,
        status=job.status,
        status_reason=job.status_reason,
        attempt=job.attempt,
        at=job.status_changed_at.isoformat(),
        is_finished=job.is_finished,
        marker=CHART_MARKERS.get(job.status, ""),
    )


def job_log_message(
    job_id: int, lines: list[LogLinePayload], last_line: int | None = None
) -> JobLogMessage:
    message = JobLogMessage(type="log", job_id=job_id, lines=lines)
    if last_line is not None:
        message["last_line"] = last_line
    return message


def job_metrics_message(
    job_id: int, samples: list[MetricSamplePayload], note: str = ""
) -> JobMetricsMessage:
    message = JobMetricsMessage(type="metrics", job_id=job_id, samples=samples)
    if note:
        message["note"] = note
    return message


def job_metrics_summary_message(
    job_id: int, samples: list[MetricSamplePayload]
) -> JobMetricsSummaryMessage:
    values = [s["utilization"] for s in samples if s["utilization"] is not None]
    return JobMetricsSummaryMessage(
        type="metrics",
        job_id=job_id,
        at=samples[0]["at"] if samples else now_iso(),
        utilization=round(sum(values) / len(values), 1) if values else None,
    )


def job_alert_message(
    job_id: int, *, kind: str, severity: str, message: str, at: datetime
) -> JobAlertMessage:
    return JobAlertMessage(
        type="alert", job_id=job_id, kind=kind, severity=severity, message=message,
        at=at.isoformat(),
    )  # fmt: skip


def budget_alert_message(
    *, budget: str, amount: Decimal, currency: str, threshold: int, kind: str, spend: Decimal
) -> BudgetAlertMessage:
    crossed = "reached" if kind == "actual" else "is forecast to reach"
    figure = "spend" if kind == "actual" else "forecast"
    return BudgetAlertMessage(
        type="alert",
        scope="budget",
        budget=budget,
        threshold=threshold,
        kind=kind,
        spend=str(spend),
        amount=str(amount),
        severity="critical" if kind == "actual" and threshold >= 100 else "warning",
        message=(
            f"Budget “{budget}” {crossed} {threshold} % ({figure} {spend:.2f} of "
            f"{amount:.2f} {currency} this month)."
        ),
        at=now_iso(),
    )


def membership_changed_message(*, tenant_id: int, user_id: int) -> MembershipChangedMessage:
    return MembershipChangedMessage(type="membership_changed", tenant_id=tenant_id, user_id=user_id)


# --- log messages on the wire ------------------------------------------------------------

# The JSON of one log message stays within 512 KiB; a larger batch goes as several
# messages, its lines in order. Servers and proxies may refuse a WebSocket message over
# 1 MiB (Daphne did, and its socket then delivered nothing more), and a browser parses a
# message whole before showing any of it.
LOG_MESSAGE_MAX_BYTES = 512 * 1024
_LOG_ENVELOPE_BYTES = 1024  # what surrounds the lines: {"type": "log", "job_id": …}
# Ends a line cut to fit one message. A stored line holds at most 64 KiB (jobs.logs.lines),
# but masked and JSON-escaped it can pass the bound ("\u0001" is 6 bytes for 1, a mask
# 36 bytes for a 4-character secret); the API reads it whole.
CUT_MARK = " […]"


def log_line_groups(
    lines: list[LogLinePayload], max_bytes: int = LOG_MESSAGE_MAX_BYTES
) -> list[list[LogLinePayload]]:
    """`lines` in order, in consecutive groups each of which, as one log message, is at
    most `max_bytes` of JSON."""
    budget = max_bytes - _LOG_ENVELOPE_BYTES
    groups: list[list[LogLinePayload]] = []
    group: list[LogLinePayload] = []
    size = 0
    for line in lines:
        encoded = len(json.dumps(line)) + 2  # and its ", " in the list
        if encoded > budget:
            line, encoded = _cut_to_fit(line, budget)
        if group and size + encoded > budget:
            groups.append(group)
            group, size = [], 0
        group.append(line)
        size += encoded
    if group:
        groups.append(group)
    return groups


def _cut_to_fit(line: LogLinePayload, budget: int) -> tuple[LogLinePayload, int]:
    text = line["text"]
    while True:
        cut = LogLinePayload(line_no=line["line_no"], rank=line["rank"], text=text + CUT_MARK,
                             ts=line["ts"])  # fmt: skip
        encoded = len(json.dumps(cut)) + 2
        if encoded <= budget:
            return cut, encoded
        text = text[: max(0, len(text) * budget // encoded - len(CUT_MARK))]


def encoded_log_messages(job_id: int, lines: list[LogLinePayload]) -> list[str]:
    """The browser's log messages carrying `lines`, JSON-encoded (ASCII: as many bytes
    as characters): one, unless it would pass LOG_MESSAGE_MAX_BYTES."""
    text = json.dumps(job_log_message(job_id, lines))
    if len(text) <= LOG_MESSAGE_MAX_BYTES:
        return [text]
    return [json.dumps(job_log_message(job_id, group)) for group in log_line_groups(lines)]
