"""`KubernetesBackend`: the one entry point, composed of a mixin per concern.

A job's attempt runs as one Indexed `batch/v1` Job per tier (on-demand, spot) in the
tenant's namespace; the objects are built in `manifests`. Every write is idempotent:
names are deterministic, 409 AlreadyExists on create and 404 on delete/patch mean "done
already", so a task that runs twice has one effect.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import httpx
from django.conf import settings

from jobs import gpu_readings
from jobs.backends.base import (
    BackendRejected,
    BackendUnavailable,
    ChaosControls,
    ComputeBackend,
    GpuReading,
)
from jobs.backends.kubernetes.fills import VolumeFillsMixin
from jobs.backends.kubernetes.inventory import InventoryMixin
from jobs.backends.kubernetes.kueue import KueueMixin
from jobs.backends.kubernetes.lifecycle import LifecycleMixin
from jobs.backends.kubernetes.namespaces import NamespacesMixin
from jobs.backends.kubernetes.observe import ObserveMixin
from jobs.backends.kubernetes.podlogs import PodLogsMixin
from jobs.backends.kubernetes.pull_secrets import PullSecretsMixin
from jobs.backends.kubernetes.sandbox import sandbox_controls
from jobs.backends.kubernetes.watch import watch_jobs

if TYPE_CHECKING:
    from jobs.models import Job

NOTE_NO_PROMETHEUS = "no GPU readings: PROMETHEUS_URL is not configured"


class KubernetesBackend(
    InventoryMixin,
    NamespacesMixin,
    KueueMixin,
    PullSecretsMixin,
    LifecycleMixin,
    ObserveMixin,
    PodLogsMixin,
    VolumeFillsMixin,
    ComputeBackend,
):
    """Jobs as Kubernetes Jobs through the official client (KUBECONFIG or in-cluster)."""

    name = "kubernetes"
    # A finished job's rendezvous Service and env Secret stay until release().
    releases_after_finish = True
    copies_pull_secrets = True

    @classmethod
    def from_settings(cls) -> KubernetesBackend:
        return cls()  # the configuration is loaded on the first call (ApiCalls)

    @property
    def simulated(self) -> bool:  # type: ignore[override]
        return bool(settings.SANDBOX_URL)

    def chaos(self) -> ChaosControls | None:
        return sandbox_controls()

    def watch(self, stop: threading.Event, on_change: Callable[[int], None]) -> bool:
        """Our Jobs and Pods, followed by jobs.backends.kubernetes.watch in a thread."""
        threading.Thread(
            target=watch_jobs,
            kwargs={"api_client": self.api_client, "stop_event": stop, "on_change": on_change},
            name="kube-watch",
            daemon=True,
        ).start()
        return True

    def gpu_readings(self, jobs: list[Job]) -> dict[int, list[GpuReading]]:
        """The DCGM exporter's readings through Prometheus, one query for all `jobs`."""
        url = settings.PROMETHEUS_URL
        if not jobs or not url:
            return {}
        try:
            return gpu_readings.prometheus_readings(jobs, url=url)
        except (httpx.HTTPError, ValueError, KeyError) as error:
            raise BackendUnavailable(f"reading GPU metrics from Prometheus: {error}") from error

    def metrics_note(self, job: Job) -> str:
        return "" if settings.PROMETHEUS_URL else NOTE_NO_PROMETHEUS

    def node_cordon(self, node: str, *, cordoned: bool = True) -> bool:
        """`kubectl cordon`: where the console's role may patch nodes (its RBAC names
        `nodes: patch` only where staff grant it); refused, it is left to staff."""
        try:
            self._call(
                f"{'cordoning' if cordoned else 'uncordoning'} node {node}",
                self.core.patch_node,
                node,
                {"spec": {"unschedulable": cordoned}},
            )
        except BackendRejected:
            return False
        return True
