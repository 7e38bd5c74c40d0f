"""Following a job's log live (in the ASGI process): exactly one `LogFollower` per job
across processes (a Redis lease, jobs.logs.leases) reads new lines and publishes them in
batches; `followers` starts one with a process's first viewer of a job and stops it with
the last. See jobs.logs for the whole design."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from jobs import realtime
from jobs.backends import BackendRejected, BackendUnavailable, get_backend
from jobs.backends.base import LogStream
from jobs.logs.leases import (
    LEASE_SECONDS,
    RELEASE_SCRIPT,
    RENEW_SCRIPT,
    redis_clients,
    redis_prefix,
)
from jobs.logs.masking import SecretMasker, job_secret_values
from jobs.logs.reading import line_count, masked_payload
from jobs.logs.stores import LogSpool, StoredLine, spool_dir
from jobs.models import Job
from jobs.realtime import LogLinePayload, parallel_db

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.1  # a batch is published at least this often while lines arrive
FOLLOW_BATCH = 2000
# How long stopping a follower may take before it is abandoned (it was told to stop).
STOP_TIMEOUT_SECONDS = 5.0


class _FileReader:
    """New lines of a job whose backend numbers its log file itself: the backend's stream
    of that file, polled in the event loop (a non-blocking read of the bytes written since
    the last poll)."""

    interval = FLUSH_SECONDS

    def __init__(self, stream: LogStream, cursor: int):
        self.stream = stream
        self.cursor = cursor
        self.first: list[str] = []

    @classmethod
    def open(cls, backend, job: Job, cursor: int) -> _FileReader:
        """Blocking (run it in a thread): the first poll finds the cursor's line in the
        file, a scan of up to the whole file."""
        (source,) = backend.log_sources(job)
        reader = cls(backend.open_log(job, source, skip=cursor), cursor)
        reader.first = reader.stream.poll()
        return reader

    async def read(self) -> list[StoredLine]:
        texts = self.stream.poll()
        if self.first:
            texts, self.first = self.first + texts, []
        lines = [StoredLine(self.cursor + i, 0, text) for i, text in enumerate(texts, 1)]
        self.cursor += len(lines)
        return lines

    def close(self) -> None:
        self.stream.close()


class _SpoolReader:
    """New lines of a job whose lines are spooled: one backend stream per source (e.g. the
    pod log API with `follow=True`, read by the stream's own thread), appended to the
    job's spool (which numbers them) and read back from it. Sources that start later (or
    replace a rank's) are found by listing them: every second while a rank is not
    followed, every `SETTLED_LIST_SECONDS` once all are."""

    interval = 1.0  # at most this long without a look, even when no stream wakes us
    # Once every rank is followed, sources are listed this often: a resumed or requeued
    # attempt's pods replace them, and a stream whose pod went away may not end at once.
    SETTLED_LIST_SECONDS = 5.0

    def __init__(self, backend, job: Job, cursor: int, wake):
        self.backend = backend
        self.job = job
        self.cursor = cursor
        self.wake = wake
        self.spool = LogSpool(spool_dir(job))
        self.streams: dict[str, LogStream] = {}
        self.read_upto: dict[str, int] = {}  # per stream: lines of its source seen so far
        self.done: set[str] = set()  # sources that stopped and were read to their end
        self.listed_at = 0.0

    @classmethod
    def open(cls, backend, job: Job, cursor: int, wake) -> _SpoolReader:
        return cls(backend, job, cursor, wake)

    def _list_due(self) -> bool:
        settled = len(self.streams) >= self.job.nodes
        wait = self.SETTLED_LIST_SECONDS if settled else 1.0
        return time.monotonic() - self.listed_at >= wait

    def _list(self) -> None:
        self.listed_at = time.monotonic()
        held = self.spool.counts()
        for source in self.backend.log_sources(self.job):
            if source.key in self.streams or source.key in self.done:
                continue
            skip = held.get(source.key, 0)
            log.info("job %s: following the log of %s from line %d", self.job.pk, source.key, skip)
            self.streams[source.key] = self.backend.open_log(
                self.job, source, skip=skip, wake=self.wake
            )
            self.read_upto[source.key] = skip

    def _collect(self, listing: bool) -> list[StoredLine]:
        try:
            if listing:
                self._list()
        except (BackendUnavailable, BackendRejected) as error:
            log.warning("listing the pods of job %s failed: %s", self.job.pk, error)
        batches = []
        for key, stream in list(self.streams.items()):
            ended = stream.ended  # read before polling: a line that came meanwhile is kept
            lines = stream.poll()
            batches.append((stream.source, self.read_upto[key], lines))
            self.read_upto[key] += len(lines)
            if ended:
                log.info("job %s: the log of %s ended", self.job.pk, key)
                del self.streams[key]
                if not stream.source.live:
                    self.done.add(key)
                self.listed_at = 0.0  # a stream stopped: look for its pod's successor
        self.spool.append(self.job.attempt, batches)
        lines = self.spool.read(self.cursor, FOLLOW_BATCH)
        if lines:
            self.cursor = lines[-1].line_no
        return lines

    async def read(self) -> list[StoredLine]:
        listing = self._list_due()
        if listing:  # a new attempt has new pods
            await parallel_db(self.job.refresh_from_db)(fields=["attempt", "status"])
        return await asyncio.to_thread(self._collect, listing)

    def close(self) -> None:
        for stream in self.streams.values():
            stream.close()
        self.streams.clear()


# Identifies this process among those with viewers of a job (see LogFollower).
PROCESS_ID = uuid.uuid4().hex
VIEWER_TTL_SECONDS = 5.0


class LogFollower:
    """Reads a job's new log lines and publishes them while this process has viewers.

    Started with the first local viewer, cancelled with the last. Only the holder of the
    job's Redis lease reads; the others wait to take over. Every second each process with
    viewers of the job notes it in a Redis hash; while the lease holder's process is the
    only one, batches go straight to its sockets (no Redis round trips per batch), else
    through the `job.<id>` group for every process."""

    def __init__(self, job_id: int, process_id: str = PROCESS_ID):
        self.job_id = job_id
        self.process_id = process_id
        self.token = uuid.uuid4().hex
        prefix = redis_prefix()
        self.lease_key = f"{prefix}:logfollow:{job_id}:lease"
        self.cursor_key = f"{prefix}:logfollow:{job_id}:cursor"
        self.viewers_key = f"{prefix}:logfollow:{job_id}:viewers"
        self.holding = False
        self.local_only = False
        self.cursor: int | None = None  # the last line published
        self._checked = asyncio.Event()
        self.task: asyncio.Task | None = None

    async def _hold_lease(self, client) -> bool:
        try:
            held = await client.eval(
                RENEW_SCRIPT, 1, self.lease_key, self.token, int(LEASE_SECONDS * 1000)
            )
        except Exception:
            log.warning("log follower lease for job %s: Redis unavailable", self.job_id)
            return False
        return bool(held)

    async def _note_viewers(self, client) -> None:
        """Record that this process has viewers of the job (now)."""
        with contextlib.suppress(Exception):
            await client.hset(self.viewers_key, self.process_id, time.time())
            await client.expire(self.viewers_key, int(VIEWER_TTL_SECONDS * 4))

    async def _only_local_viewers(self, client) -> bool:
        try:
            noted = await client.hgetall(self.viewers_key)
        except Exception:
            return False
        fresh = {
            key.decode() if isinstance(key, bytes) else key
            for key, at in noted.items()
            if time.time() - float(at) < VIEWER_TTL_SECONDS
        }
        return fresh <= {self.process_id}

    async def release(self) -> None:
        client = redis_clients.get()
        with contextlib.suppress(Exception):
            await client.hdel(self.viewers_key, self.process_id)
        if not self.holding:
            return
        self.holding = False
        with contextlib.suppress(Exception):
            await client.eval(RELEASE_SCRIPT, 1, self.lease_key, self.token)

    async def _publish(self, lines: list[LogLinePayload], last_line: int) -> None:
        if self.local_only:
            realtime.hub().deliver_local(
                realtime.job_group(self.job_id),
                dict(realtime.job_log_message(self.job_id, lines, last_line)),
            )
        else:
            await realtime.apublish_job_logs(self.job_id, lines, last_line=last_line)

    async def _keep(self, client) -> None:
        """Every second: note this process's viewers, hold (or wait for) the lease, check
        for viewers in other processes and save the cursor. A task of its own, so a slow
        Redis answer never delays the reading loop's next poll."""
        saved_cursor: int | None = None
        while True:
            await self._note_viewers(client)
            holding = await self._hold_lease(client)
            if holding:
                was_local = self.local_only
                self.local_only = await self._only_local_viewers(client)
                cursor = self.cursor
                if was_local and not self.local_only and cursor is not None:
                    # Viewers elsewhere now: tell them how far the log reaches.
                    await realtime.apublish_job_logs(self.job_id, [], last_line=cursor)
                if cursor is not None and cursor != saved_cursor:
                    with contextlib.suppress(Exception):
                        await client.set(self.cursor_key, cursor, ex=7 * 24 * 3600)
                        saved_cursor = cursor
            self.holding = holding
            self._checked.set()
            await asyncio.sleep(1.0)

    async def run(self) -> None:
        client = redis_clients.get()
        cursor: int | None = None
        masker: SecretMasker | None = None
        reader: _FileReader | _SpoolReader | None = None
        woken = asyncio.Event()
        loop = asyncio.get_running_loop()

        def wake() -> None:  # from a stream's reading thread
            loop.call_soon_threadsafe(woken.set)

        keeper = asyncio.ensure_future(self._keep(client))
        polled_at = time.monotonic()
        try:
            while True:
                if not self.holding:
                    if reader is not None:
                        reader.close()
                    reader = cursor = self.cursor = None
                    self._checked.clear()
                    await self._checked.wait()  # the keeper's next look at the lease
                    continue
                try:
                    if reader is None or cursor is None:
                        job = await parallel_db(Job.objects.get)(pk=self.job_id)
                        masker = SecretMasker(await parallel_db(job_secret_values)(job))
                        end = await asyncio.to_thread(line_count, job)
                        stored = await client.get(self.cursor_key)
                        cursor = min(int(stored), end) if stored is not None else end
                        self.cursor = cursor
                        backend = await asyncio.to_thread(get_backend, job.backend)
                        if backend.log_file(job) is not None:
                            reader = await asyncio.to_thread(_FileReader.open, backend, job, cursor)
                        else:
                            reader = _SpoolReader.open(backend, job, cursor, wake)
                        # Tells sockets how far the store reaches, so none waits on a gap.
                        await realtime.apublish_job_logs(self.job_id, [], last_line=cursor)
                        if self.local_only:
                            await self._publish([], cursor)
                    woken.clear()
                    lines = await reader.read()
                except Job.DoesNotExist:
                    return
                except Exception:
                    log.warning(
                        "log follower of job %s failed; retrying", self.job_id, exc_info=True
                    )
                    if reader is not None:
                        reader.close()
                    reader = cursor = None
                    await asyncio.sleep(1.0)
                    continue
                if lines:
                    cursor = self.cursor = lines[-1].line_no
                    await self._publish(masked_payload(lines, masker, realtime.now_iso()), cursor)
                    if len(lines) >= FOLLOW_BATCH:
                        continue
                if isinstance(reader, _FileReader):
                    # A file is polled at a fixed rate, not "sleep after work" (which adds
                    # the work and the event loop's lag to every line's wait), but never
                    # twice within half an interval (more, smaller batches cost more).
                    now = time.monotonic()
                    polled_at = max(polled_at + reader.interval, now + reader.interval / 2)
                    await asyncio.sleep(polled_at - now)
                    continue
                # A pod log stream wakes us when lines come.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(woken.wait(), reader.interval)
                if woken.is_set():
                    await asyncio.sleep(FLUSH_SECONDS / 2)  # let a burst make one batch
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await keeper
            if reader is not None:
                reader.close()


class _FollowerRegistry:
    """This process's followers, one per job with at least one local viewer."""

    def __init__(self):
        self.followers: dict[tuple[int, int], LogFollower] = {}
        self.viewers: dict[tuple[int, int], int] = {}

    def _key(self, job_id: int) -> tuple[int, int]:
        return (id(asyncio.get_running_loop()), job_id)

    def watch(self, job_id: int) -> None:
        key = self._key(job_id)
        self.viewers[key] = self.viewers.get(key, 0) + 1
        running = self.followers.get(key)
        if running is None or running.task is None or running.task.done():
            # None yet, or one that stopped (it returns only when the job is gone): a new
            # viewer must not wait on a follower that no longer reads.
            follower = LogFollower(job_id)
            follower.task = asyncio.ensure_future(follower.run())
            self.followers[key] = follower

    async def unwatch(self, job_id: int) -> None:
        key = self._key(job_id)
        remaining = self.viewers.get(key, 0) - 1
        if remaining > 0:
            self.viewers[key] = remaining
            return
        self.viewers.pop(key, None)
        follower = self.followers.pop(key, None)
        if follower is not None and follower.task is not None:
            follower.task.cancel()
            # Bounded: a follower stuck in a call that ignores cancellation must not hang
            # the socket's disconnect (or a server's shutdown) with it.
            await asyncio.wait({follower.task}, timeout=STOP_TIMEOUT_SECONDS)
            await follower.release()

    def active(self, job_id: int) -> bool:
        return self._key(job_id) in self.followers


followers = _FollowerRegistry()


async def close_for_loop() -> None:
    """Stop this loop's followers and close its Redis client (tests, shutdown)."""
    loop_id = id(asyncio.get_running_loop())
    for key in [k for k in followers.followers if k[0] == loop_id]:
        followers.viewers[key] = 1
        await followers.unwatch(key[1])
    await redis_clients.close()
