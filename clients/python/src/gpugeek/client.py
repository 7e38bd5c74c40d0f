"""`Client`: the API's resources as methods returning typed models."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from gpugeek.http import Transport, env_url
from gpugeek.models import Budget, Estimate, GpuType, Invoice, Job, NodePool, Offer

_default: Client | None = None


class Client:
    """A connection to one console. `url` and `token` default to `GPUGEEK_URL` and
    `GPUGEEK_TOKEN`. The latest client made is the default of `Cluster.create`."""

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.25,
        transport: httpx.BaseTransport | None = None,
    ):
        global _default
        self.url = (url or env_url()).rstrip("/")
        self.token = token if token is not None else os.environ.get("GPUGEEK_TOKEN")
        self.http = Transport(
            self.url, self.token, timeout=timeout, retries=retries, backoff=backoff,
            transport=transport,
        )  # fmt: skip
        _default = self

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- catalog ----

    def gpu_types(self) -> list[GpuType]:
        return [GpuType.from_dict(row) for row in self.http.paginate("gpu-types")]

    def pools(self) -> list[NodePool]:
        return [NodePool.from_dict(row) for row in self.http.paginate("pools")]

    def list_offers(self, **filters: Any) -> list[Offer]:
        """Offers (filters: gpu_type, vendor, region, tier, min_memory_gib, available,
        sort, include_cpu)."""
        params = {k: _param(v) for k, v in filters.items() if v is not None}
        return [Offer.from_dict(row) for row in self.http.paginate("offers", **params)]

    def estimate(self, **request: Any) -> Estimate:
        """POST /estimates: gpu_type, gpus_per_node (or cpus), nodes, region, spot_ratio,
        hours, tier, reserved_months. `count` is split like a launch's."""
        from gpugeek.spec import resolve_gpu_type, split_count

        body = {k: (str(v) if k in ("spot_ratio", "hours") else v) for k, v in request.items()}
        if body.get("gpu_type"):
            body["gpu_type"] = resolve_gpu_type(self, body["gpu_type"])
        count = body.pop("count", None)
        if count is not None and body.get("gpu_type"):
            body["nodes"], body["gpus_per_node"] = split_count(
                self, body["gpu_type"], int(count), body.get("region")
            )
        body.setdefault("nodes", 1)
        return Estimate.from_dict(self.http.post("estimates", body))

    # --- jobs ----

    def jobs(self, status: str | None = None) -> Iterator[Job]:
        for row in self.http.paginate("jobs", status=status):
            yield Job.from_dict(row)

    def job(self, job_id: int) -> Job:
        return Job.from_dict(self.http.get(f"jobs/{int(job_id)}"))

    def create_cluster(self, spec: dict[str, Any], *, idempotency_key: str | None = None):
        from gpugeek.cluster import Cluster

        return Cluster.create(spec, client=self, idempotency_key=idempotency_key)

    def cluster(self, job_id: int):
        from gpugeek.cluster import Cluster

        return Cluster(self, self.job(job_id))

    @contextmanager
    def session(self, spec: dict[str, Any], *, idempotency_key: str | None = None):
        """`with gg.session({...}) as cluster:` launches, and cancels on exit if the
        cluster is still active (whatever ended the block)."""
        cluster = self.create_cluster(spec, idempotency_key=idempotency_key)
        try:
            yield cluster
        finally:
            cluster.refresh()
            if cluster.job.is_active:
                cluster.cancel()

    # --- billing ----

    def budgets(self) -> list[Budget]:
        return [Budget.from_dict(row) for row in self.http.paginate("budgets")]

    def invoices(self) -> list[Invoice]:
        return [Invoice.from_dict(row) for row in self.http.paginate("invoices")]

    def cost_summary(self) -> dict[str, Any]:
        return self.http.get("costs/summary")

    def me(self) -> dict[str, Any]:
        return self.http.get("me")


def _param(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    return value


def default_client() -> Client:
    return _default if _default is not None else Client()
