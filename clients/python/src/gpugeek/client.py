"""`Client`: the API's resources as methods returning typed models."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import httpx

from gpugeek.cluster import Cluster
from gpugeek.environments import Environments
from gpugeek.errors import Conflict, NotFound
from gpugeek.http import Transport, env_url
from gpugeek.models import (
    Budget,
    Estimate,
    GpuType,
    Invoice,
    Job,
    NodePool,
    Offer,
    Recommendation,
)
from gpugeek.services import Services
from gpugeek.spec import errors_named_count, nodes_check, resolve_gpu_type, split_count
from gpugeek.ssh_keys import SshKeys
from gpugeek.volumes import Volumes

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
        self.environments = Environments(self.http)
        self.services = Services(self.http)
        self.ssh_keys = SshKeys(self.http)
        self.volumes = Volumes(self.http)
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
        body = {k: (str(v) if k in ("spot_ratio", "hours") else v) for k, v in request.items()}
        if body.get("gpu_type"):
            body["gpu_type"] = resolve_gpu_type(self, body["gpu_type"])
        count = body.pop("count", None)
        if count is not None and body.get("gpu_type"):
            body["nodes"], body["gpus_per_node"] = split_count(
                self, body["gpu_type"], int(count), body.get("region")
            )
        body.setdefault("nodes", 1)
        nodes_check(body["nodes"], used_count=count is not None)
        with errors_named_count(count is not None):
            return Estimate.from_dict(self.http.post("estimates", body))

    def recommend(
        self,
        parameters_billion: float | str | Decimal,
        *,
        workload: str,
        precision: str = "bf16",
        **request: Any,
    ) -> Recommendation:
        """POST /recommendations: the GPU memory a model of `parameters_billion` needs for
        `workload` (pretrain, full_finetune, lora, qlora, inference) at `precision` (fp32,
        bf16, fp16, int8, int4), and the GPU configurations that hold it, fitting first,
        then cheapest. Optional: sequence_length, batch_size, tier, region, layers,
        hidden_size, kv_heads, head_dim, lora_rank."""
        body = {
            "parameters_billion": str(parameters_billion),
            "workload": workload,
            "precision": precision,
            **{k: v for k, v in request.items() if v is not None},
        }
        return Recommendation.from_dict(self.http.post("recommendations", body))

    # --- jobs ----

    def jobs(self, status: str | None = None) -> Iterator[Job]:
        for row in self.http.paginate("jobs", status=status):
            yield Job.from_dict(row)

    def job(self, job_id: int) -> Job:
        return Job.from_dict(self.http.get(f"jobs/{int(job_id)}"))

    def create_cluster(
        self, spec: dict[str, Any], *, idempotency_key: str | None = None
    ) -> Cluster:
        return Cluster.create(spec, client=self, idempotency_key=idempotency_key)

    def cluster(self, job_id: int) -> Cluster:
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

    def budget(self, name: str) -> Budget | None:
        """The budget called `name` (names are unique in a tenant), or None."""
        return next((b for b in self.budgets() if b.name == name), None)

    def set_budget(
        self,
        name: str,
        *,
        amount: Decimal | str | int | None = None,
        period: str | None = None,
        action: str | None = None,
        thresholds: list[int] | None = None,
        project: str | None = None,
        webhook_url: str | None = None,
    ) -> Budget:
        """Create the budget called `name`, or change the given fields of the one that
        exists. `action`: "pause_non_critical" (at 100 %) or "alert_only"; `thresholds`:
        alert percents, e.g. [50, 80, 100]. A new webhook's signing secret is in the
        result's `extra["webhook_secret"]`, this once."""
        fields = {
            "amount": None if amount is None else str(amount),
            "period": period, "action": action, "thresholds": thresholds,
            "project": project, "webhook_url": webhook_url,
        }  # fmt: skip
        changes = {k: v for k, v in fields.items() if v is not None}
        existing = self.budget(name)
        if existing is None:
            try:
                body = self.http.post("budgets", {"name": name, **changes}, create=True)
                return Budget.from_dict(body)
            except Conflict:
                # Made meanwhile, or by an earlier try of this POST whose answer was lost.
                existing = self.budget(name)
                if existing is None:
                    raise
        body = self.http.request("PATCH", f"budgets/{existing.id}", json=changes)
        return Budget.from_dict(body)

    def delete_budget(self, name: str) -> None:
        existing = self.budget(name)
        if existing is None:
            raise NotFound(f"no budget called {name!r}", status=404, code="not_found")
        self.http.request("DELETE", f"budgets/{existing.id}")

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


def recommend(
    parameters_billion: float | str | Decimal, *, workload: str, **request: Any
) -> Recommendation:
    """`gpugeek.recommend(7, workload="lora")`: `Client.recommend` on the default client
    (the latest made, else one from GPUGEEK_URL and GPUGEEK_TOKEN)."""
    return default_client().recommend(parameters_billion, workload=workload, **request)
