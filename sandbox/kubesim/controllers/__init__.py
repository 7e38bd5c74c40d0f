"""The simulated cluster's controllers, run together by ``tick()``: Kueue and JobSet
(when installed), the Job controller, the HorizontalPodAutoscaler, Deployment and
ReplicaSet controllers, the scheduler and kubelet (serving pods' HTTP servers and
readiness probes included), the Endpoints controller and the quota controller. A tick
repeats their passes until a pass changes nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sandbox.kubesim.controllers.deployments import DeploymentsController
from sandbox.kubesim.controllers.endpoints import EndpointsController
from sandbox.kubesim.controllers.hpa import HPAController
from sandbox.kubesim.controllers.jobs import JobsController
from sandbox.kubesim.controllers.jobset import JobSetController
from sandbox.kubesim.controllers.kueue import KueueController
from sandbox.kubesim.controllers.pods import PodsController
from sandbox.kubesim.controllers.quota import QuotaController


class Controllers(
    KueueController,
    JobSetController,
    JobsController,
    HPAController,
    DeploymentsController,
    EndpointsController,
    PodsController,
    QuotaController,
):
    """All controllers; ``tick()`` runs them now (the server also runs them every
    ``auto_tick`` seconds, and its helpers after each change unless paused)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._paused = 0

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Pause the automatic controller (and the helpers' implicit tick)."""
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    def _react(self) -> None:
        if not self._paused:
            self.tick()

    def tick(self, max_passes: int = 10) -> None:
        """Run the fake controllers until nothing changes (at most ``max_passes`` passes).

        Running pods' tickers write their output first, outside the lock, so that a pod
        that ends in this tick has written all of its log before it ends; serving pods'
        readiness probes (HTTP requests) run outside the lock too."""
        self._run_tickers()
        self._probe_serving()
        with self._lock:
            for _ in range(max_passes):
                before = self._rv
                self._kueue_pass()
                self._jobset_pass()
                self._jobs_pass()
                self._hpa_pass()
                self._deployments_pass()
                self._replicasets_pass()
                self._pods_pass()
                self._serving_pass()
                self._endpoints_pass()
                self._quota_pass()
                if self._rv == before:
                    break
