"""`Cluster`: one launched job, with its lifecycle (wait, logs, pause, resume, cancel)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from gpugeek.errors import ConnectionFailed, ServerError, Timeout
from gpugeek.http import new_idempotency_key
from gpugeek.models import FINISHED_STATUSES, Job, LogLine, decimal
from gpugeek.spec import job_payload

if TYPE_CHECKING:
    from gpugeek.client import Client


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
        from gpugeek.client import default_client

        client = client or default_client()
        body = job_payload(client, spec)
        key = idempotency_key or new_idempotency_key()
        return cls(client, Job.from_dict(client.http.post("jobs", body, create=True, key=key)))

    def refresh(self) -> Cluster:
        self.job = self.client.job(self.job.id)
        return self

    def _act(self, action: str) -> Cluster:
        self.job = Job.from_dict(self.client.http.post(f"jobs/{self.job.id}/{action}"))
        return self

    def pause(self) -> Cluster:
        return self._act("pause")

    def resume(self) -> Cluster:
        return self._act("resume")

    def cancel(self) -> Cluster:
        return self._act("cancel")

    def cost(self) -> Decimal:
        self.refresh()
        return decimal(self.job.cost_to_date) or Decimal(0)

    def wait(
        self, status: str | tuple[str, ...] = "running", *, timeout: float = 600, poll: float = 1.0
    ) -> Cluster:
        """Poll until the job reaches `status` (or one of several). Raises `Timeout`, or
        `Conflict` if it finishes in another status first."""
        from gpugeek.errors import Conflict

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
                raise Timeout(f"job {self.job.id} is {self.job.status} after {timeout}s")
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
    ) -> Iterator[LogLine]:
        """The job's log lines after `since_line`.

        With `follow`, keeps polling `GET /jobs/<id>/logs?since_line=N` until the job has
        finished and its log is drained. Every request resumes after the last line
        yielded, so a dropped connection or a 5xx (beyond the transport's own retries:
        up to `reconnects` in a row, `poll` seconds apart) leaves no gap and no
        duplicate."""
        since = since_line
        deadline = None if timeout is None else time.monotonic() + timeout
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
                raise Timeout(f"job {self.job.id} still {self.job.status} after {timeout}s")
            time.sleep(poll)

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
