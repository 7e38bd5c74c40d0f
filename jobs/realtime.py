"""The one place that talks to channel groups: `job.<id>` and `tenant.<id>`.

Publishing never breaks the caller: a Redis outage loses a live update (the page catches
up on reconnect), never a state change. Sends tied to a database change happen after the
transaction commits.

Receiving goes through one `GroupHub` per ASGI process (per event loop): the hub is the
only member of each group in its process and fans every message out in memory to the
sockets of that process that subscribed. With 1,000 sockets on 100 jobs a log batch
crosses Redis once per process instead of once per socket (10× fewer Redis messages in
the benchmark's case), and the per-socket cost is an in-memory queue put.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import NotRequired, TypedDict

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

# The one envelope and sender.
from console.realtime import (
    BROADCAST_GROUP,
    relay_envelope,
    send_many,
    send_to_group,
    send_to_groups,
)

log = logging.getLogger(__name__)


def parallel_db(function):
    """`function` (it reads the database) for the event loop: run in a worker thread of
    its own, not asgiref's one thread-sensitive thread, so many sockets read in parallel,
    and with the connection closed (or its pool slot given back) after each call, which
    asgiref's sync_to_async never does: one kept open on a long-lived thread holds a pool
    slot and is never checked after a database restart."""
    return database_sync_to_async(function, thread_sensitive=False)


# --- payloads (what the browser receives, JSON) -------------------------------------------


class JobStatusMessage(TypedDict):
    type: str  # "status"
    job_id: int
    status: str
    status_reason: str
    attempt: int
    at: str
    is_finished: NotRequired[bool]


class LogLinePayload(TypedDict):
    line_no: int  # 1-based, global per job (across ranks)
    rank: int
    text: str
    ts: str  # when the server read the line (ISO 8601)


class JobLogMessage(TypedDict):
    type: str  # "log"
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
    type: str  # "metrics"
    job_id: int
    samples: list[MetricSamplePayload]
    note: NotRequired[str]  # e.g. "no GPU": why there are no samples


class JobMetricsSummaryMessage(TypedDict):
    """What the tenant's job list gets per tick: enough for a utilisation sparkline."""

    type: str  # "metrics"
    job_id: int
    at: str
    utilization: float | None  # mean over the job's GPUs


class JobAlertMessage(TypedDict):
    type: str  # "alert"
    job_id: int
    kind: str  # utilization_unstable | memory_leak | loss_explosion | gpu_idle
    severity: str  # warning | critical
    message: str
    at: str


class TenantAlertMessage(TypedDict):
    type: str  # "alert"
    kind: str  # e.g. budget_threshold
    severity: str
    message: str
    at: str
    job_id: NotRequired[int]


def job_group(job_id: int) -> str:
    return f"job.{job_id}"


def tenant_group(tenant_id: int) -> str:
    return f"tenant.{tenant_id}"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


# --- log messages on the wire ------------------------------------------------------------

# Daphne refuses to send a WebSocket message over 1 MiB (its websocket_max_message_size:
# autobahn raises, and the socket delivers nothing more), so the JSON of one log message
# stays at half that; a larger batch goes as several messages, its lines in order.
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
    text = json.dumps(JobLogMessage(type="log", job_id=job_id, lines=lines))
    if len(text) <= LOG_MESSAGE_MAX_BYTES:
        return [text]
    return [
        json.dumps(JobLogMessage(type="log", job_id=job_id, lines=group))
        for group in log_line_groups(lines)
    ]


# --- publishing -----------------------------------------------------------------------------


async def _asend(group: str, message: dict) -> None:
    try:
        layer = get_channel_layer()
        if layer is not None:
            await layer.group_send(group, relay_envelope(group, message))
    except Exception:
        log.warning("realtime publish to %s failed", group, exc_info=True)


def _status_message(job) -> tuple[list[str], dict]:
    message = JobStatusMessage(
        type="status",
        job_id=job.pk,
        status=job.status,
        status_reason=job.status_reason,
        attempt=job.attempt,
        at=job.status_changed_at.isoformat(),
        is_finished=job.is_finished,
    )
    return [job_group(job.pk), tenant_group(job.tenant_id)], dict(message)


def publish_job_status(job) -> None:
    groups, message = _status_message(job)
    transaction.on_commit(lambda: send_to_groups(groups, message))


def publish_jobs_status(jobs) -> None:
    """`publish_job_status` for many jobs, sent together after commit."""
    messages = [_status_message(job) for job in jobs]
    transaction.on_commit(lambda: send_many(messages))


async def apublish_job_logs(
    job_id: int, lines: list[LogLinePayload], last_line: int | None = None
) -> None:
    """A batch of log lines (the job's log follower, in the ASGI process)."""
    message = JobLogMessage(type="log", job_id=job_id, lines=lines)
    if last_line is not None:
        message["last_line"] = last_line
    await _asend(job_group(job_id), dict(message))


def publish_job_metrics(
    job_id: int, tenant_id: int, samples: list[MetricSamplePayload], note: str = ""
) -> None:
    """New samples of one job: to the job page, and a summary to the tenant's job list."""
    message = JobMetricsMessage(type="metrics", job_id=job_id, samples=samples)
    if note:
        message["note"] = note
    values = [s["utilization"] for s in samples if s["utilization"] is not None]
    summary = JobMetricsSummaryMessage(
        type="metrics",
        job_id=job_id,
        at=samples[0]["at"] if samples else now_iso(),
        utilization=round(sum(values) / len(values), 1) if values else None,
    )

    def send() -> None:
        send_to_group(job_group(job_id), dict(message))
        if samples:
            send_to_group(tenant_group(tenant_id), dict(summary))

    transaction.on_commit(send)


def publish_job_alert(job, *, kind: str, severity: str, message: str, at: datetime) -> None:
    payload = JobAlertMessage(
        type="alert",
        job_id=job.pk,
        kind=kind,
        severity=severity,
        message=message,
        at=at.isoformat(),
    )
    tenant_id = job.tenant_id

    def send() -> None:
        send_to_groups([job_group(job.pk), tenant_group(tenant_id)], dict(payload))

    transaction.on_commit(send)


def publish_tenant_alert(
    tenant_id: int, *, kind: str, severity: str, message: str, job_id: int | None = None
) -> None:
    """A tenant-wide alert (e.g. a budget threshold) for every open page of the tenant."""
    payload = TenantAlertMessage(
        type="alert", kind=kind, severity=severity, message=message, at=now_iso()
    )
    if job_id is not None:
        payload["job_id"] = job_id
    transaction.on_commit(lambda: send_to_group(tenant_group(tenant_id), dict(payload)))


# --- receiving: one hub per process -------------------------------------------------------

# Called with each message of a group; returns None, or an awaitable to await in order.
Subscriber = Callable[[dict], Awaitable[None] | None]
# Delivered to every subscriber when the hub may have missed messages: catch up from the
# database and the log store (never sent to browsers as is).
RESYNC = "_resync"


class GroupHub:
    """Joins channel groups on behalf of this process's sockets and fans messages out.

    A subscriber is a plain callable taking the payload dict (a consumer puts it on its
    own queue, so its sends stay ordered). The hub re-adds its memberships periodically,
    so a Redis restart (which forgets groups) heals without reconnecting every socket.
    """

    REFRESH_SECONDS = 30.0

    def __init__(self, layer):
        self.layer = layer
        self.channel: str | None = None
        self.subscribers: dict[str, set[Subscriber]] = {}
        self._ready = asyncio.Lock()
        self._reader: asyncio.Task | None = None
        self._refresher: asyncio.Task | None = None
        self._closing = False

    async def _start(self) -> None:
        async with self._ready:
            if self.channel is None:
                # The default prefix: channels-redis receives all of a process's
                # "specific." channels through one Redis list; another prefix would make a
                # second list, and receivers on both would take turns (seconds of delay).
                self.channel = await self.layer.new_channel()
                self._reader = asyncio.ensure_future(self._read())
                self._refresher = asyncio.ensure_future(self._refresh())
                try:
                    await self.layer.group_add(BROADCAST_GROUP, self.channel)
                except Exception as error:
                    # Started all the same: the refresher joins it again.
                    log.warning("realtime hub could not join %s (%s)", BROADCAST_GROUP, error)

    async def subscribe(self, group: str, subscriber: Subscriber) -> None:
        await self._start()
        first = group not in self.subscribers
        self.subscribers.setdefault(group, set()).add(subscriber)
        if first:
            await self.layer.group_add(group, self.channel)

    async def unsubscribe(self, group: str, subscriber: Subscriber) -> None:
        members = self.subscribers.get(group)
        if not members:
            return
        members.discard(subscriber)
        if not members:
            del self.subscribers[group]
            with contextlib.suppress(Exception):
                await self.layer.group_discard(group, self.channel)

    async def deliver_local(self, group: str, payload: dict) -> None:
        """Hand `payload` to this process's subscribers of `group` without Redis (a
        publisher that knows no other process has subscribers)."""
        for subscriber in list(self.subscribers.get(group, ())):
            pending = self._deliver(subscriber, payload)
            if pending is not None:
                try:
                    await pending
                except Exception:
                    log.debug("realtime direct send failed", exc_info=True)

    def local_count(self, group: str) -> int:
        return len(self.subscribers.get(group, ()))

    async def _read(self) -> None:
        while not self._closing:
            try:
                message = await self.layer.receive(self.channel)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                if self._closing:
                    return
                # A failed read may have lost a message (or Redis restarted and forgot
                # our groups): rejoin, and tell every socket to catch up from the truth.
                log.warning("realtime hub receive failed (%s); resyncing", error)
                await asyncio.sleep(0.5)
                for group in [BROADCAST_GROUP, *self.subscribers]:
                    with contextlib.suppress(Exception):
                        await self.layer.group_add(group, self.channel)
                self._fan_out_all({"type": RESYNC})
                continue
            if message.get("type") == "relay_many":
                for entry in message.get("messages") or []:
                    for group in entry.get("groups") or []:
                        if group in self.subscribers:
                            await self.deliver_local(group, dict(entry.get("payload") or {}))
                continue
            group, payload = message.get("group"), message.get("payload")
            if not group or payload is None:
                continue
            await self.deliver_local(group, payload)

    def _fan_out_all(self, payload: dict) -> None:
        delivered: set = set()
        for members in list(self.subscribers.values()):
            for subscriber in list(members):
                if subscriber not in delivered:
                    delivered.add(subscriber)
                    self._deliver(subscriber, payload)  # queued: never a direct send

    @staticmethod
    def _deliver(subscriber: Subscriber, payload: dict):
        """Hand `payload` to a subscriber; it may return an awaitable (a send it can make
        right away), which the hub awaits before the next subscriber."""
        try:
            return subscriber(payload)
        except Exception:
            log.warning("realtime subscriber failed", exc_info=True)
            return None

    async def close(self) -> None:
        self._closing = True
        tasks = {task for task in (self._reader, self._refresher) if task is not None}
        for task in tasks:
            task.cancel()
        if tasks:
            # Bounded, like every shutdown step: a read stuck in Redis must not hang it.
            await asyncio.wait(tasks, timeout=5.0)
        self.subscribers.clear()
        self.channel = None

    async def _refresh(self) -> None:
        while True:
            await asyncio.sleep(self.REFRESH_SECONDS)
            for group in [BROADCAST_GROUP, *self.subscribers]:
                with contextlib.suppress(Exception):
                    await self.layer.group_add(group, self.channel)


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupHub] = weakref.WeakKeyDictionary()


def _receiving_layer():
    """The channel layer the hub receives with: the configured one, except that a
    channels-redis layer gets a socket timeout above its blocking pop's (redis-py 8 sets
    both to 5 s, so an idle receive would fail every 5 s and the hub would resync every
    socket). Same Redis, same prefix: any process's group_send reaches it."""
    from django.conf import settings

    layer = get_channel_layer()
    config = settings.CHANNEL_LAYERS.get("default", {})
    if config.get("BACKEND") != "channels_redis.core.RedisChannelLayer":
        return layer
    options = dict(config.get("CONFIG", {}))
    hosts = []
    for host in options.get("hosts", []):
        host = {"address": host} if isinstance(host, str) else dict(host)
        if (host.get("socket_timeout") or 0) <= layer.brpop_timeout:
            host["socket_timeout"] = layer.brpop_timeout * 6
        hosts.append(host)
    options["hosts"] = hosts
    return type(layer)(**options)


def hub() -> GroupHub:
    """This event loop's hub (Daphne has one loop; tests may run several, one at a time)."""
    loop = asyncio.get_running_loop()
    found = _hubs.get(loop)
    if found is None:
        found = _hubs[loop] = GroupHub(_receiving_layer())
    return found


async def close_hub() -> None:
    """Stop this loop's hub and close its Redis pools (tests, shutdown)."""
    found = _hubs.pop(asyncio.get_running_loop(), None)
    if found is not None:
        await found.close()
        if hasattr(found.layer, "close_pools"):
            await found.layer.close_pools()
    layer = get_channel_layer()
    if layer is not None and hasattr(layer, "close_pools"):
        await layer.close_pools()
