"""Pod logs: the attempt's rank logs as sources, read once or followed by a thread."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from jobs.backends.base import (
    LogLine,
    LogSource,
)
from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.client import (
    ApiCalls,
    api_message,
    current_pods,
    main_container_status,
)
from jobs.logs.lines import LineSplitter, decode, split_pieces

if TYPE_CHECKING:
    from jobs.models import Job

log = logging.getLogger(__name__)


class PodLogsMixin(ApiCalls):
    # --- logs -------------------------------------------------------------------------------------
    def log_sources(self, job: Job) -> list[LogSource]:
        """The main container log of the newest pod of each rank, once it has started."""
        sources = []
        for rank, pod in current_pods(self._attempt_pods(job)).items():
            state = getattr(main_container_status(pod), "state", None)
            if state is None or (state.running is None and state.terminated is None):
                continue  # waiting: the API has no log to give yet (400)
            sources.append(
                LogSource(
                    rank=rank,
                    key=f"{pod.metadata.name}/{pod.metadata.uid}",
                    live=state.terminated is None,
                )
            )
        return sources

    def open_log(
        self,
        job: Job,
        source: LogSource,
        *,
        skip: int = 0,
        follow: bool = True,
        wake: Callable[[], None] | None = None,
    ) -> PodLogStream:
        stream = PodLogStream(
            self.core,
            manifests.namespace_name(job.tenant_id),
            source,
            skip=skip,
            follow=follow,
            wake=wake,
        )
        stream.start()
        return stream

    def logs(self, job: Job, since_line: int = 0, limit: int = 1000) -> list[LogLine]:
        """The attempt's log lines after `since_line`, numbered globally rank by rank: all
        of rank 0's lines (1…k), then rank 1's, and so on (rank = completion index +
        tier offset; the newest pod of each rank). Within a rank the order is the
        container's. While several ranks still write, a later rank's numbers move up as
        earlier ranks grow; the numbering is final once the attempt has ended (and always
        for one-node jobs). Pods not started yet, or gone, contribute no lines."""
        namespace = manifests.namespace_name(job.tenant_id)
        lines: list[LogLine] = []
        number = 0
        for rank, pod in current_pods(self._attempt_pods(job)).items():
            text = self._call(
                f"reading the log of {pod.metadata.name}",
                self.core.read_namespaced_pod_log,
                pod.metadata.name,
                namespace,
                container=manifests.CONTAINER,
                ok=(400, 404),
            )
            pieces, _ends = split_pieces((text or "").encode(), final=True)
            for piece in pieces:  # lines of up to 64 KiB, as the spool numbers them
                number += 1
                if number > since_line:
                    lines.append(LogLine(line_no=number, rank=rank, text=decode(piece)))
                    if len(lines) >= limit:
                        return lines
        return lines


# Seconds a followed pod log may stay silent before the connection is renewed (a quiet
# job then costs one reconnect per interval; a dead connection is noticed in this time).
FOLLOW_READ_TIMEOUT = 300


class PodLogStream:
    """One pod's main-container log through the pod log API (`jobs.backends.base.LogStream`).

    With `follow=True` a daemon thread holds one streaming response (`follow=True`,
    `_preload_content=False`) and collects complete lines as the kubelet sends them;
    with `follow=False` the log so far is read once. The API cannot start at a line, so
    the first `skip` lines are read and dropped. A last line without its newline counts
    only once the container has stopped (its text can't change any more)."""

    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        source: LogSource,
        *,
        skip: int = 0,
        follow: bool = True,
        wake: Callable[[], None] | None = None,
    ):
        self.core = core
        self.namespace = namespace
        self.source = source
        self.skip = skip
        self.follow = follow
        self.wake = wake or (lambda: None)
        self.pod_name = source.key.split("/", 1)[0]
        self.error = ""
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._finished = False  # the reading side is done
        self._closed = False
        self._response: Any = None

    def start(self) -> None:
        if self.follow:
            name = f"pod-log-{self.pod_name}"
            threading.Thread(target=self._read, name=name, daemon=True).start()
        else:
            self._read()

    def poll(self) -> list[str]:
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    @property
    def ended(self) -> bool:
        with self._lock:
            return self._finished and not self._lines

    def close(self) -> None:
        with self._lock:
            self._closed = True
            response = self._response
        if response is not None:
            # Unblocks the reading thread's recv at once (it then releases the response).
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                response.shutdown()

    def _read(self) -> None:
        response = None
        seen = 0  # lines of the source read so far, skipped ones included
        splitter = LineSplitter()  # lines of up to 64 KiB, numbered as jobs.logs.lines says
        clean_end = False
        try:
            response = self.core.read_namespaced_pod_log(
                self.pod_name,
                self.namespace,
                container=manifests.CONTAINER,
                follow=self.follow,
                _preload_content=False,
                _request_timeout=(settings.KUBERNETES_REQUEST_TIMEOUT, FOLLOW_READ_TIMEOUT),
            )
            with self._lock:
                if self._closed:
                    return
                self._response = response
            while True:
                data = response.read1(1 << 16)  # returns what has arrived, unlike read()
                if not data:
                    clean_end = True
                    break
                pieces = splitter.feed(data)
                if pieces:
                    seen = self._add(pieces, seen)
        except ApiException as error:
            if error.status not in (400, 404):  # not started yet / gone: nothing to read
                self.error = api_message(error)
        except (HTTPError, OSError, ValueError) as error:
            self.error = str(error)
        finally:
            # The end of a follow means the container stopped; a snapshot is final only if
            # it had stopped when listed. A closed stream's partial line may grow still.
            stopped = self.follow or not self.source.live
            if clean_end and stopped and not self._closed:
                self._add(splitter.finish(), seen)
            if self.error and not self._closed:
                log.warning("reading the log of pod %s: %s", self.pod_name, self.error)
            if response is not None:
                response.close()
                response.release_conn()
            with self._lock:
                self._finished = True
            self.wake()

    def _add(self, raws: list[bytes], seen: int) -> int:
        if not raws:
            return seen
        texts = [decode(raw) for raw in raws]
        fresh = texts[max(0, self.skip - seen) :]
        if fresh:
            with self._lock:
                self._lines.extend(fresh)
            self.wake()
        return seen + len(texts)
