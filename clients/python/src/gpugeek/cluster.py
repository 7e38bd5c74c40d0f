"""`Cluster`: one launched job, with its lifecycle (wait, logs, pause, resume, cancel)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING, Any

# The module, not its names: gpugeek.client imports this module (Client makes clusters),
# and this one needs the default client only when a cluster is created.
from gpugeek import client as client_module
from gpugeek.errors import Conflict, ConnectionFailed, NotFound, ServerError, Timeout
from gpugeek.http import new_idempotency_key
from gpugeek.models import FINISHED_STATUSES, Job, LogLine, decimal
from gpugeek.spec import errors_named_count, job_payload

if TYPE_CHECKING:
    from gpugeek.client import Client

# How long a log stream may stay silent (the server sends a heartbeat every 10 s) before
# it counts as a dropped link.
STREAM_READ_TIMEOUT = 45.0


class Cluster:
    def __init__(self, client: Client, job: Job):
        self.client = client
        self.job = job

    def __repr__(self) -> str:
        return f"<Cluster {self.job.id} {self.job.name!r} {self.job.status}>"

    @property
    def id(self) -> int:
        return self.job.id

    @property
    def status(self) -> str:
        return self.job.status

    @classmethod
    def create(
        cls,
        spec: dict[str, Any],
        *,
        client: Client | None = None,
        idempotency_key: str | None = None,
    ) -> Cluster:
        """Launch a job. One idempotency key covers every retry of this call, so it
        creates one job; pass your own key to make a re-run of a script idempotent too."""
        client = client or client_module.default_client()
        body = job_payload(client, spec)
        key = idempotency_key or new_idempotency_key()
        with errors_named_count("count" in spec):
            answer = client.http.post("jobs", body, create=True, key=key)
        return cls(client, Job.from_dict(answer))

    def refresh(self) -> Cluster:
        self.job = self.client.job(self.job.id)
        return self

    def _act(self, action: str) -> Cluster:
        self.job = Job.from_dict(self.client.http.post(f"jobs/{self.job.id}/{action}"))
        return self

    def pause(self, *, wait: bool = True, timeout: float = 600, poll: float = 1.0) -> Cluster:
        """Pause a running job: its work checkpoints and stops, and billing stops. With
        `wait` (the default) this returns once the job is `paused`, so a `resume()` may
        follow at once; `wait=False` returns while it is still `pausing`. Raises
        `Timeout` after `timeout` seconds, `Conflict` if the job can't be paused (it isn't
        running) or finishes first."""
        self._act("pause")
        return self.wait("paused", timeout=timeout, poll=poll) if wait else self

    def resume(self, *, wait: bool = True, timeout: float = 600, poll: float = 1.0) -> Cluster:
        """Resume a paused job from its checkpoint. With `wait` (the default) this returns
        once it is `running` again (it may queue for capacity first: `timeout` covers
        that); `wait=False` returns at once. Raises `Timeout`, or `Conflict` if the job
        isn't paused or finishes before it runs."""
        self._act("resume")
        return self.wait("running", timeout=timeout, poll=poll) if wait else self

    def cancel(self) -> Cluster:
        """Stop the job for good. One whose work runs is "cancelling" (still billed) until
        its processes are gone: `cancel().wait("cancelled")` waits for that."""
        return self._act("cancel")

    def cost(self) -> Decimal:
        self.refresh()
        return decimal(self.job.cost_to_date) or Decimal(0)

    def wait(
        self, status: str | tuple[str, ...] = "running", *, timeout: float = 600, poll: float = 1.0
    ) -> Cluster:
        """Poll until the job reaches `status` (or one of several). Raises `Timeout`, or
        `Conflict` if it finishes in another status first."""
        wanted = (status,) if isinstance(status, str) else tuple(status)
        deadline = time.monotonic() + timeout
        while True:
            self.refresh()
            if self.job.status in wanted:
                return self
            if self.job.status in FINISHED_STATUSES:
                raise Conflict(
                    f"job {self.job.id} finished as {self.job.status} "
                    f"({self.job.status_reason}) before reaching {'/'.join(wanted)}",
                    code="finished",
                )
            if time.monotonic() >= deadline:
                raise Timeout(
                    f"job {self.job.id} is still {self.job.status} after {timeout}s "
                    f"(waiting for {'/'.join(wanted)})"
                )
            time.sleep(poll)

    def logs(
        self,
        *,
        follow: bool = False,
        since_line: int = 0,
        poll: float = 1.0,
        limit: int = 1000,
        timeout: float | None = None,
        reconnects: int = 20,
        stream: bool = True,
    ) -> Iterator[LogLine]:
        """The job's log lines after `since_line`.

        With `follow`, keeps reading until the job has finished and its log is drained:
        over the streaming endpoint (`GET /jobs/<id>/logs/stream`, NDJSON) unless
        `stream=False` or the server has none, else by polling `GET /jobs/<id>/logs`
        every `poll` seconds. Each reconnect (a dropped link, a 5xx: up to `reconnects`
        in a row, `poll` seconds apart) resumes after the last line yielded, so there is
        no gap and no duplicate. `Timeout` once `timeout` seconds have passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if follow and stream:
            yield from self._follow_stream(since_line, deadline, poll, limit, reconnects)
        else:
            yield from self._follow_poll(since_line, deadline, poll, limit, reconnects, follow)

    def _follow_stream(
        self, since: int, deadline: float | None, poll: float, limit: int, reconnects: int
    ) -> Iterator[LogLine]:
        failures = 0
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise self._timed_out()
            heard = False
            try:
                for message in self.client.http.stream(
                    f"jobs/{self.job.id}/logs/stream", since_line=since,
                    read_timeout=STREAM_READ_TIMEOUT if left is None
                    else max(0.1, min(STREAM_READ_TIMEOUT, left)),
                ):  # fmt: skip
                    heard = True
                    kind = message.get("type")
                    if kind == "log":
                        for row in message.get("lines") or ():
                            line = LogLine.from_dict(row)
                            if line.line_no > since:  # never one twice, whatever comes
                                since = line.line_no
                                yield line
                    elif kind == "status" and message.get("status"):
                        self.job.status = message["status"]
                    elif kind == "end":
                        self.job.status = message.get("status") or self.job.status
                        return
                    if deadline is not None and time.monotonic() >= deadline:
                        raise self._timed_out()
            except NotFound:
                # No such job (refresh raises NotFound again), or a server without the
                # streaming endpoint: follow by polling instead.
                self.refresh()
                yield from self._follow_poll(since, deadline, poll, limit, reconnects, True)
                return
            except (ConnectionFailed, ServerError):
                if deadline is not None and time.monotonic() >= deadline:
                    raise self._timed_out() from None
            # Here the stream broke or ended without its "end": resume after `since`.
            failures = 0 if heard else failures + 1
            if failures > reconnects:
                raise ConnectionFailed(
                    f"log stream of job {self.job.id}: no answer in {failures} tries"
                )
            if not heard:
                time.sleep(poll)

    def _follow_poll(
        self,
        since: int,
        deadline: float | None,
        poll: float,
        limit: int,
        reconnects: int,
        follow: bool,
    ) -> Iterator[LogLine]:
        failures = 0
        while True:
            try:
                lines = self._read_logs(since, limit)
                finished = False
                if not lines and follow:
                    finished = self.refresh().job.status in FINISHED_STATUSES
                    if finished:  # lines written between the empty read and the status
                        lines = self._read_logs(since, limit)
            except (ConnectionFailed, ServerError):
                failures += 1
                if not follow or failures > reconnects:
                    raise
                time.sleep(poll)
                continue
            failures = 0
            if lines:
                since = lines[-1].line_no
            yield from lines
            if lines:
                continue  # drain what is there before looking at the status again
            if not follow or finished:
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise self._timed_out()
            time.sleep(poll)

    def _timed_out(self) -> Timeout:
        return Timeout(f"job {self.job.id} still {self.job.status} after its log timeout")

    def _read_logs(self, since: int, limit: int) -> list[LogLine]:
        """The lines after `since` (never one at or before it, whatever the server sends)."""
        page = self.client.http.get(f"jobs/{self.job.id}/logs", since_line=since, limit=limit)
        fresh = []
        for row in page.get("lines", []):
            line = LogLine.from_dict(row)
            if line.line_no > since:
                since = line.line_no
                fresh.append(line)
        return fresh
