"""`GET /api/v1/jobs/<id>/logs/stream?since_line=N`: a job's log as it grows, over plain
HTTP (NDJSON, one JSON object a line), for the SDK (`httpx` reads it natively, so the SDK
needs no WebSocket library) and for `curl -N`.

Objects: `{"type": "log", "lines": [...]}` (the lines after `since_line`, in order,
each once), `{"type": "status", ...}` (the job's status changed), `{"type": "heartbeat"}`
(every `HEARTBEAT_SECONDS` without anything else, so a client can tell a dead link from
a quiet job), and `{"type": "end", "status", "last_line"}` once the job has finished and
every line has been sent. A stream that stops without `end` (the link dropped, the server
restarted, `STREAM_SECONDS` passed) is resumed with `since_line` = the last line received.

The lines come the way the job page's socket gets them (jobs.consumers): the job's one
log follower publishes batches to `job.<id>`, and a `JobLogCursor` fills any gap from the
store. Access is checked like the socket's: the job through the tenant scope (another
tenant's job is a 404), the membership again whenever it changes (`AccessWatch`), and
the token on every reconnect, which `STREAM_SECONDS` forces now and then.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers

from jobs import realtime
from jobs.api.streams import JobView
from jobs.consumers import AccessWatch, JobLogCursor, LogInbox, reload_job
from jobs.logs.follower import followers
from jobs.models import Job

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"
HEARTBEAT_SECONDS = 10.0
STREAM_SECONDS = 300.0
# Once the job has finished, the stream ends after this long without a new batch: a
# follower still reading the end of a pod's log publishes it meanwhile.
SETTLE_SECONDS = 1.0
# Objects waiting for a slow client (each at most realtime.LOG_MESSAGE_MAX_BYTES of lines):
# the store is read no further ahead, and the server sends at the client's pace.
OUTBOX_SIZE = 4


class LogStreamQuerySerializer(serializers.Serializer):
    since_line = serializers.IntegerField(
        default=0, min_value=0, help_text="Send the lines after this one (0: all)"
    )


class JobLogStreamView(JobView):
    """The job's log lines after `since_line`, then each new one as it is written, until
    the job has finished: NDJSON objects `log` (`lines`), `status`, `heartbeat` (every
    10 s of silence) and, last, `end` (`status`, `last_line`). A stream that stops without
    `end` is resumed with `since_line` = the last line received."""

    @extend_schema(
        parameters=[LogStreamQuerySerializer],
        responses={(200, NDJSON): OpenApiResponse(OpenApiTypes.STR, description="NDJSON")},
    )
    def get(self, request, pk: int):
        job = self.job(pk)
        query = LogStreamQuerySerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        since_line = query.validated_data["since_line"]
        response = StreamingHttpResponse(
            job_log_stream(job, since_line=since_line, user=request.user), content_type=NDJSON
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # a buffering proxy (nginx) passes each line on
        return response


async def job_log_stream(job: Job, *, since_line: int, user) -> AsyncIterator[bytes]:
    """The encoded objects; heartbeats while the producer has nothing to say. Runs in
    the ASGI server's loop; a client that goes away cancels it (Django closes it)."""
    outbox: asyncio.Queue[dict | None] = asyncio.Queue(maxsize=OUTBOX_SIZE)
    producer = asyncio.ensure_future(_produce(job, since_line, user, outbox))
    try:
        while True:
            try:
                message = await asyncio.wait_for(outbox.get(), HEARTBEAT_SECONDS)
            except TimeoutError:
                if producer.done():  # it failed (and logged why) without its last word
                    return
                message = {"type": "heartbeat"}
            if message is None:
                return
            yield (json.dumps(message) + "\n").encode()
    finally:
        producer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await producer


async def _produce(job: Job, since_line: int, user, outbox: asyncio.Queue) -> None:
    async def send_lines(lines: list) -> None:
        for group in realtime.log_line_groups(lines):
            await outbox.put({"type": "log", "lines": group})

    cursor = JobLogCursor(job, send_lines)
    cursor.last_sent = since_line
    try:
        if job.is_finished:  # nothing will be written: no follower, no subscription
            await cursor.fill_to(None)
            await outbox.put(_end(cursor))
        else:
            await _follow(cursor, user, outbox)
    except Exception:
        log.warning("log stream of job %s stopped", job.pk, exc_info=True)
    finally:
        with contextlib.suppress(asyncio.QueueFull):
            outbox.put_nowait(None)


async def _follow(cursor: JobLogCursor, user, outbox: asyncio.Queue) -> None:
    job_id = cursor.job.pk
    inbox = LogInbox()  # a slow client's batches are read from the store once caught up

    async def revoke() -> None:
        inbox.put({"type": "_revoked"})

    group = realtime.job_group(job_id)
    access = AccessWatch(user, cursor.job.tenant_id, revoke)
    # Subscribed before the first read: a line written meanwhile is in the read or in
    # the inbox (or both: the cursor drops the repeat).
    await realtime.hub().subscribe(group, inbox.put)
    followers.watch(job_id)
    try:
        if not await access.start():
            return
        cursor.job = await reload_job(job_id) or cursor.job
        await cursor.fill_to(None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + STREAM_SECONDS
        finished = cursor.job.is_finished
        while True:
            wait = deadline - loop.time()
            try:
                message = await asyncio.wait_for(
                    inbox.get(), min(wait, SETTLE_SECONDS) if finished else wait
                )
            except TimeoutError:
                if finished:
                    await cursor.fill_to(None)
                    await outbox.put(_end(cursor))
                return  # else STREAM_SECONDS: the client reconnects, showing its token
            kind = message.get("type")
            if kind == "log":
                await cursor.deliver(message)
            elif kind == "_revoked":
                return
            elif kind in ("status", realtime.RESYNC):
                cursor.job = await reload_job(job_id) or cursor.job
                finished = cursor.job.is_finished
                if kind == "status":
                    await outbox.put(message)
                else:  # the hub may have missed batches
                    await cursor.fill_to(None)
            await inbox.fill_dropped(cursor)
    finally:
        await access.stop()
        await realtime.hub().unsubscribe(group, inbox.put)
        await followers.unwatch(job_id)


def _end(cursor: JobLogCursor) -> dict:
    return {"type": "end", "status": cursor.job.status, "last_line": cursor.last_sent}
