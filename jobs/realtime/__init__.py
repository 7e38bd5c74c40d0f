"""Realtime, in one package: everything that goes to or comes from channel groups.

- `messages`: every payload (a `TypedDict` with its `type`), its one builder, the groups,
  and how a log batch is cut into WebSocket messages;
- `sender`: the one sender to groups, from sync code and from the event loop;
- `publish`: what services, tasks, the watcher and billing call (after commit);
- `hub`: each ASGI process's one member of the groups, fanning messages out to its
  sockets and API log streams.

Only this package talks to the channel layer (checked by tests/test_architecture.py).
"""

from jobs.realtime.hub import RESYNC, GroupHub, close_hub, hub, parallel_db
from jobs.realtime.messages import (
    CHART_MARKERS,
    CUT_MARK,
    LOG_MESSAGE_MAX_BYTES,
    MEMBERSHIP_CHANGED,
    BudgetAlertMessage,
    JobAlertMessage,
    JobLogMessage,
    JobMetricsMessage,
    JobMetricsSummaryMessage,
    JobStatusMessage,
    LogLinePayload,
    MembershipChangedMessage,
    MetricSamplePayload,
    RealtimeMessage,
    encoded_log_messages,
    job_group,
    job_log_message,
    job_status_message,
    log_line_groups,
    membership_group,
    now_iso,
    tenant_group,
)
from jobs.realtime.publish import (
    apublish_job_logs,
    publish_budget_alert,
    publish_job_alert,
    publish_job_metrics,
    publish_job_status,
    publish_jobs_status,
    publish_membership_changed,
)

__all__ = [
    "CHART_MARKERS", "CUT_MARK", "LOG_MESSAGE_MAX_BYTES", "MEMBERSHIP_CHANGED", "RESYNC",
    "BudgetAlertMessage", "GroupHub", "JobAlertMessage", "JobLogMessage",
    "JobMetricsMessage", "JobMetricsSummaryMessage", "JobStatusMessage", "LogLinePayload",
    "MembershipChangedMessage", "MetricSamplePayload", "RealtimeMessage",
    "apublish_job_logs", "close_hub", "encoded_log_messages", "hub", "job_group",
    "job_log_message", "job_status_message", "log_line_groups", "membership_group",
    "now_iso", "parallel_db", "publish_budget_alert", "publish_job_alert",
    "publish_job_metrics", "publish_job_status", "publish_jobs_status",
    "publish_membership_changed", "tenant_group",
]  # fmt: skip
