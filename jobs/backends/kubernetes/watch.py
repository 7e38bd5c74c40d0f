"""Kubernetes watch on our Jobs and Pods: tells the watcher which console jobs changed.

`watch_jobs` streams changes of every `batch/v1` Job and Pod labelled
`app.kubernetes.io/managed-by=gpugeek`, in all namespaces, and calls `on_change(job_id)`
(the pod's or Job's `gpugeek.io/job` label) for each. It doesn't interpret anything: the
watcher then observes that job through the backend (jobs.services), so the watch is a
trigger, and the periodic pass stays the safety net for anything a watch could miss.

Each resource kind is followed in its own thread, the standard list-then-watch way: a
list gives the current objects (all reported, which also catches up after a restart) and
a resourceVersion; the watch resumes from the last version seen; on 410 Gone (history
expired) it lists again; on other errors it waits (capped back-off) and resumes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from django.conf import settings
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from jobs.backends.kubernetes.manifests import JOB_LABEL, managed_selector

log = logging.getLogger(__name__)


def job_id_of(obj: Any) -> int | None:
    """The console job id in an object's `gpugeek.io/job` label (model or raw dict)."""
    if isinstance(obj, dict):
        labels = (obj.get("metadata") or {}).get("labels") or {}
    else:
        labels = (obj.metadata.labels if obj.metadata else None) or {}
    try:
        return int(labels[JOB_LABEL])
    except (KeyError, TypeError, ValueError):
        return None


class _ResourceWatch:
    """List-then-watch of one resource kind, resuming from its last resourceVersion."""

    def __init__(
        self,
        kind: str,
        list_fn: Callable[..., Any],
        stop_event: threading.Event,
        on_change: Callable[[int], None],
        timeout_seconds: int,
        max_backoff: float,
    ) -> None:
        self.kind = kind
        self.list_fn = list_fn
        self.stop_event = stop_event
        self.on_change = on_change
        self.timeout_seconds = timeout_seconds
        self.max_backoff = max_backoff
        self.resource_version: str | None = None
        self.relists = 0
        self._watch: watch.Watch | None = None

    def _report(self, obj: Any) -> None:
        job_id = job_id_of(obj)
        if job_id is None:
            return
        try:
            self.on_change(job_id)
        except Exception:  # a bad callback must not end the watch
            log.exception("on_change(%s) failed", job_id)

    def _relist(self) -> None:
        listed = self.list_fn(
            label_selector=managed_selector(), _request_timeout=settings.KUBERNETES_REQUEST_TIMEOUT
        )
        self.resource_version = listed.metadata.resource_version
        self.relists += 1
        for item in listed.items:
            self._report(item)

    def _stream(self) -> None:
        self._watch = watch.Watch()
        # Read timeout a little over the server-side one, so a silent stream ends cleanly.
        request_timeout = (
            settings.KUBERNETES_REQUEST_TIMEOUT,
            self.timeout_seconds + settings.KUBERNETES_REQUEST_TIMEOUT,
        )
        for event in self._watch.stream(
            self.list_fn,
            label_selector=managed_selector(),
            resource_version=self.resource_version,
            timeout_seconds=self.timeout_seconds,
            allow_watch_bookmarks=True,
            _request_timeout=request_timeout,
        ):
            raw = event.get("raw_object") or {}
            version = (raw.get("metadata") or {}).get("resourceVersion")
            if version:
                self.resource_version = version
            if event.get("type") != "BOOKMARK":
                self._report(raw)
            if self.stop_event.is_set():
                break

    def run(self) -> None:
        failures = 0
        while not self.stop_event.is_set():
            try:
                if self.resource_version is None:
                    self._relist()
                self._stream()
                failures = 0
            except ApiException as error:
                if self.stop_event.is_set():
                    break
                if error.status == 410:  # history expired: list again, then watch
                    log.info("%s watch expired (410); listing again", self.kind)
                    self.resource_version = None
                    continue
                failures += 1
                log.warning("%s watch failed (%s); retrying", self.kind, error.status)
            except (HTTPError, OSError, ValueError) as error:
                if self.stop_event.is_set():
                    break
                failures += 1
                log.warning("%s watch interrupted: %s; retrying", self.kind, error)
            if failures:
                self.stop_event.wait(min(self.max_backoff, 0.5 * 2 ** min(failures, 8)))

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.stop()  # also shuts the socket, ending a blocked read at once


def watch_jobs(
    *,
    api_client: client.ApiClient,
    stop_event: threading.Event,
    on_change: Callable[[int], None],
    timeout_seconds: int = 60,
    max_backoff: float = 30.0,
) -> None:
    """Follow our Jobs and Pods until `stop_event` is set, calling `on_change(job_id)`
    for every event (from watch threads: keep it quick and thread-safe, e.g. a
    queue.put). Blocks; returns shortly after `stop_event` is set."""
    batch = client.BatchV1Api(api_client)
    core = client.CoreV1Api(api_client)
    watches = [
        _ResourceWatch(
            "jobs",
            batch.list_job_for_all_namespaces,
            stop_event,
            on_change,
            timeout_seconds,
            max_backoff,
        ),
        _ResourceWatch(
            "pods",
            core.list_pod_for_all_namespaces,
            stop_event,
            on_change,
            timeout_seconds,
            max_backoff,
        ),
    ]
    threads = [
        threading.Thread(target=w.run, name=f"kube-watch-{w.kind}", daemon=True) for w in watches
    ]
    for thread in threads:
        thread.start()
    stop_event.wait()
    for w in watches:
        w.stop()
    for thread in threads:
        thread.join(timeout=5)
