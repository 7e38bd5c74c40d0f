"""WebSocket consumers: a job's live page (`/ws/jobs/<id>/`) and a tenant's job list
(`/ws/tenant/`). Thin: check access once at connect, then relay what `jobs.realtime`
delivers; log completeness rules live in `JobLogCursor`.

Refusals happen before `accept()`, so the HTTP handshake is answered 403: 4403 for an
anonymous socket or a job of a tenant the user is no member of, 4404 for a job that does
not exist (foreign Origins are refused earlier by AllowedHostsOriginValidator).

Access is checked again whenever the person's membership of the tenant changes: every
socket joins `jobs.realtime.membership_group(tenant, user)` before its connect-time
check (so no change can slip between the two), and closes with 4403 when a re-check
fails (removed from the organisation, or a role without the socket's capability).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.permissions import Capability, has_capability
from console.selectors import resolve_membership
from console.tenancy import SESSION_TENANT_KEY
from jobs import realtime
from jobs.logs.follower import followers
from jobs.logs.reading import BACKFILL_LINES, read_lines, tail_lines
from jobs.models import Job
from jobs.realtime import MEMBERSHIP_CHANGED, membership_group, parallel_db

log = logging.getLogger(__name__)

# Without `?since_line=` the server waits this long for a `resume` before it sends the
# backfill, so a client that resumes at once gets no line twice.
RESUME_GRACE_SECONDS = 0.25
FILL_CHUNK = 1000
# Beyond this many undelivered messages, or this much undelivered log text, a slow
# socket (or API log stream) drops live log batches; it fills the gap from the store once
# it catches up (latency, never lost lines), so what it holds stays bounded.
MAX_QUEUED = 200
MAX_QUEUED_LOG_CHARS = 4 << 20


# What every socket of this module needs in its tenant, at connect and on each re-check.
SOCKET_CAPABILITY = Capability.VIEW_TENANT
# The close code of a socket whose access is gone (the handshake's refusal code).
ACCESS_REVOKED = 4403


@parallel_db
def _may_view(user, tenant_id: int) -> bool:
    membership = resolve_membership(user, tenant_id)
    return (
        membership is not None
        and membership.tenant_id == tenant_id
        and has_capability(membership, SOCKET_CAPABILITY)
    )


@parallel_db
def reload_job(job_id: int) -> Job | None:
    return Job.objects.filter(pk=job_id).first()


class AccessWatch:
    """A socket's subscription to its person's membership notices in one tenant: on each,
    access is checked again and `revoke` (stop and close the socket) runs if it is gone.

    `start` subscribes first and checks second, so a change committed at any time after
    the check is seen."""

    def __init__(self, user, tenant_id: int, revoke):
        self.user = user
        self.tenant_id = tenant_id
        self.revoke = revoke  # async () -> None
        self.group = membership_group(tenant_id, user.pk)
        self.recheck: asyncio.Task | None = None
        self.subscribed = False

    async def start(self) -> bool:
        """Subscribe, then check access now; False (and unsubscribed) when refused."""
        await realtime.hub().subscribe(self.group, self._changed)
        self.subscribed = True
        if await _may_view(self.user, self.tenant_id):
            return True
        await self.stop()
        return False

    def _changed(self, message: dict) -> None:
        # A resync means the hub may have missed a notice: check as if one came.
        if message.get("type") not in (MEMBERSHIP_CHANGED, realtime.RESYNC):
            return
        if self.recheck is None or self.recheck.done():
            # Not awaited by the hub: the check reads the database, and the hub's other
            # subscribers must not wait for it.
            self.recheck = asyncio.ensure_future(self._check_again())

    async def _check_again(self) -> None:
        try:
            allowed = await _may_view(self.user, self.tenant_id)
        except Exception:
            log.warning("socket access re-check failed; closing", exc_info=True)
            allowed = False
        if not allowed:
            await self.revoke()

    async def stop(self) -> None:
        if not self.subscribed:
            return
        self.subscribed = False
        await realtime.hub().unsubscribe(self.group, self._changed)
        recheck = self.recheck
        if recheck is not None and recheck is not asyncio.current_task():
            recheck.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await recheck


class JobLogCursor:
    """What one socket has sent of a job's log: lines are sent in order, each once, with
    gaps (a lost or dropped batch, a follower hand-over) filled from the store."""

    def __init__(self, job: Job, send_lines, send_encoded=None):
        self.job = job
        self.send_lines = send_lines  # async (lines) -> None
        self.send_encoded = send_encoded  # async (encoded messages) -> None
        self.last_sent = 0
        self.first_sent = 1  # lines before it were never sent on this socket

    async def backfill(self, count: int = BACKFILL_LINES) -> None:
        lines, last = await parallel_db(tail_lines)(self.job, count)
        if lines:
            await self.send_lines(lines)
        self.last_sent = last
        self.first_sent = lines[0]["line_no"] if lines else last + 1

    async def resume(self, since_line: int) -> None:
        """The client holds every line up to `since_line`: send what it lacks, and no line
        this socket already sent (a backfill that started after `since_line` + 1 left
        older lines unsent: those are sent now, out of order, each with its number)."""
        if since_line >= self.last_sent:
            if self.last_sent == 0:  # nothing sent yet: the client starts after since_line
                self.first_sent = since_line + 1
            self.last_sent = since_line
            await self.fill_to(None)
            return
        if since_line + 1 < self.first_sent:
            older = JobLogCursor(self.job, self.send_lines)
            older.last_sent = since_line
            await older.fill_to(self.first_sent - 1)
            self.first_sent = since_line + 1

    async def fill_to(self, upto: int | None) -> None:
        """Send every stored line after `last_sent` (up to `upto`, or all there are)."""
        while upto is None or self.last_sent < upto:
            limit = FILL_CHUNK if upto is None else min(FILL_CHUNK, upto - self.last_sent)
            page = await parallel_db(read_lines)(self.job, since_line=self.last_sent, limit=limit)
            lines = page["lines"]
            if not lines:
                return
            await self.send_lines(lines)
            self.last_sent = lines[-1]["line_no"]

    async def deliver(self, message: dict) -> None:
        batch = message.get("lines") or []
        lines = [line for line in batch if line["line_no"] > self.last_sent]
        if lines and lines[0]["line_no"] > self.last_sent + 1:
            await self.fill_to(lines[0]["line_no"] - 1)
            lines = [line for line in lines if line["line_no"] > self.last_sent]
        if lines:
            if len(lines) == len(batch) and self.send_encoded is not None:
                # The usual case: the whole batch, encoded once for every socket.
                await self.send_encoded(_encoded_batch(message))
            else:
                await self.send_lines(lines)
            self.last_sent = lines[-1]["line_no"]
        last_line = message.get("last_line")
        if last_line is not None and last_line > self.last_sent:
            await self.fill_to(last_line)


class LogInbox:
    """A log reader's queue of hub messages. A slow reader's log batches beyond
    MAX_QUEUED messages or MAX_QUEUED_LOG_CHARS of text are dropped, remembering the last
    line they carried; once the reader has caught up, `fill_dropped` reads those lines
    from the store instead. Read it with `get` / `get_nowait`, which keep the count."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.dropped_last_line = 0
        self.queued_chars = 0  # of the log lines waiting in `queue`

    def put(self, message: dict) -> None:
        if message.get("type") == "log":
            lines = message.get("lines") or ()
            chars = _text_chars(message)
            full = self.queued_chars > 0 and self.queued_chars + chars > MAX_QUEUED_LOG_CHARS
            if full or self.queue.qsize() >= MAX_QUEUED:
                last = message.get("last_line") or (lines[-1]["line_no"] if lines else 0)
                self.dropped_last_line = max(self.dropped_last_line, last)
                return
            self.queued_chars += chars
        self.queue.put_nowait(message)

    async def get(self) -> dict:
        return self._taken(await self.queue.get())

    def get_nowait(self) -> dict:
        return self._taken(self.queue.get_nowait())

    def _taken(self, message: dict) -> dict:
        if message.get("type") == "log":
            self.queued_chars -= _text_chars(message)
        return message

    async def fill_dropped(self, cursor: JobLogCursor) -> None:
        if self.queue.empty() and self.dropped_last_line > cursor.last_sent:
            await cursor.fill_to(self.dropped_last_line)


def _text_chars(message: dict) -> int:
    return sum(len(line["text"]) for line in message.get("lines") or ())


def _encoded_batch(message: dict) -> list[str]:
    """The browser's form of a published log batch (one message, or several for a
    large one), JSON-encoded once per process (the hub hands the same dict to every
    socket of the job)."""
    texts = message.get("_encoded")
    if texts is None:
        texts = realtime.encoded_log_messages(message["job_id"], message["lines"])
        message["_encoded"] = texts
    return texts


class JobConsumer(AsyncJsonWebsocketConsumer):
    """Status, log lines, metrics and alerts of one job, for a member of its tenant."""

    # No per-socket channel: the process's realtime.GroupHub receives for every socket.
    channel_layer_alias = None

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4403)
            return
        job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
        job = await reload_job(job_id)
        if job is None:
            await self.close(code=4404)
            return
        self.access = AccessWatch(user, job.tenant_id, self._revoke)
        if not await self.access.start():
            await self.close(code=ACCESS_REVOKED)
            return
        self.job = job
        self.group = realtime.job_group(job.pk)
        self.inbox = LogInbox()
        self.first_message = asyncio.Event()
        self.resume_from: int | None = None
        self.cursor = JobLogCursor(job, self._send_lines, self._send_encoded)
        query = parse_qs(self.scope.get("query_string", b"").decode())
        since = query.get("since_line", [None])[0]
        if since is not None and since.isdigit():
            self.resume_from = int(since)
            self.first_message.set()
        # Subscribe before reading the backfill: a line written meanwhile is then either
        # in the backfill or in the queue (or both: the cursor drops the repeat).
        await realtime.hub().subscribe(self.group, self._enqueue)
        followers.watch(job.pk)
        self.watching = True
        await self.accept()
        # Read again now that we are subscribed: a change made between the first read and
        # the subscription would otherwise be lost, and the page (which stops polling
        # while its socket is open) would show the old status until it is reloaded.
        self.job = job = await reload_job(job_id) or job
        await self.send_json(realtime.job_status_message(job))
        self.pump = asyncio.ensure_future(self._pump())

    def _enqueue(self, message: dict) -> None:
        # Sent from the pump, never from the hub: the server holds a send until this
        # client's connection drains, and the hub must not wait for one slow client.
        self.inbox.put(message)

    async def _send_encoded(self, texts: list[str]) -> None:
        """The one sender of this socket's log messages (each within the server's frame
        limit: jobs.realtime.encoded_log_messages)."""
        for text in texts:
            await self.send(text_data=text)

    async def _send_lines(self, lines: list) -> None:
        await self._send_encoded(realtime.encoded_log_messages(self.job.pk, lines))

    async def _pump(self) -> None:
        try:
            if self.resume_from is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.first_message.wait(), RESUME_GRACE_SECONDS)
            if self.resume_from is not None:
                await self.cursor.resume(self.resume_from)
            else:
                await self.cursor.backfill()
            while True:
                message = await self.inbox.get()
                kind = message.get("type")
                if kind == "log":
                    await self.cursor.deliver(message)
                elif kind == "_resume":
                    await self.cursor.resume(message["since_line"])
                elif kind == realtime.RESYNC:
                    # Every socket of the process gets the same message: one read of each
                    # job serves all of its sockets.
                    reloads = message.setdefault("jobs", {})
                    if self.job.pk not in reloads:
                        reloads[self.job.pk] = asyncio.ensure_future(reload_job(self.job.pk))
                    job = await reloads[self.job.pk]
                    if job is not None:
                        self.job = self.cursor.job = job
                        await self.send_json(realtime.job_status_message(job))
                    await self.cursor.fill_to(None)
                else:
                    await self.send_json(message)
                await self.inbox.fill_dropped(self.cursor)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            # Usually the client went away mid-send; anything else is worth a trace.
            log.warning("job socket for job %s stopped: %r", self.job.pk, error)
            log.debug("job socket failure", exc_info=True)
            with contextlib.suppress(Exception):
                await self.close(code=1011)

    async def receive_json(self, content, **kwargs):
        if not isinstance(content, dict) or content.get("type") != "resume":
            return
        try:
            since_line = max(0, int(content.get("since_line", 0)))
        except (TypeError, ValueError):
            return
        if not self.first_message.is_set():
            self.resume_from = since_line
            self.first_message.set()
        else:
            self.inbox.put({"type": "_resume", "since_line": since_line})

    async def _revoke(self) -> None:
        """Access is gone: send nothing more, then close."""
        await self.disconnect(ACCESS_REVOKED)
        await self.close(code=ACCESS_REVOKED)

    async def disconnect(self, code):
        access = getattr(self, "access", None)
        if access is not None:
            await access.stop()
        if not getattr(self, "watching", False):
            return
        self.watching = False
        pump = getattr(self, "pump", None)
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pump
        await realtime.hub().unsubscribe(self.group, self._enqueue)
        await followers.unwatch(self.job.pk)


@parallel_db
def current_membership(user, session):
    tenant_id = session.get(SESSION_TENANT_KEY) if session is not None else None
    return resolve_membership(user, tenant_id)


class TenantConsumer(AsyncJsonWebsocketConsumer):
    """Job list updates (status, metrics summaries) and alerts of the current tenant."""

    channel_layer_alias = None  # see JobConsumer

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4403)
            return
        membership = await current_membership(user, self.scope.get("session"))
        if membership is None:
            await self.close(code=4403)
            return
        self.access = AccessWatch(user, membership.tenant_id, self._revoke)
        if not await self.access.start():
            await self.close(code=ACCESS_REVOKED)
            return
        self.group = realtime.tenant_group(membership.tenant_id)
        self.queue: asyncio.Queue = asyncio.Queue()
        await realtime.hub().subscribe(self.group, self.queue.put_nowait)
        self.subscribed = True
        await self.accept()
        self.pump = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        try:
            while True:
                message = await self.queue.get()
                if message.get("type") == realtime.RESYNC:
                    message = {"type": "resync"}  # the page reloads what it shows
                await self.send_json(message)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # usually the client went away mid-send
            log.warning("tenant socket stopped: %r", error)

    async def receive_json(self, content, **kwargs):
        return  # nothing to ask for yet

    async def _revoke(self) -> None:
        """Access is gone: send nothing more, then close."""
        await self.disconnect(ACCESS_REVOKED)
        await self.close(code=ACCESS_REVOKED)

    async def disconnect(self, code):
        access = getattr(self, "access", None)
        if access is not None:
            await access.stop()
        if not getattr(self, "subscribed", False):
            return
        self.subscribed = False
        self.pump.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.pump
        await realtime.hub().unsubscribe(self.group, self.queue.put_nowait)
