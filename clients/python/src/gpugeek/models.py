"""Typed models of the API's documents. Hand-written; tests/sdk checks them against the
OpenAPI schema served at /api/v1/schema/ so they can't drift."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, TypeVar

T = TypeVar("T", bound="Model")

FINISHED_STATUSES = frozenset({"succeeded", "failed", "cancelled"})


@dataclass
class Model:
    extra: dict[str, Any] = field(default_factory=dict, repr=False, kw_only=True)

    @classmethod
    def api_fields(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        names = set(cls.api_fields())
        known = {k: v for k, v in data.items() if k in names}
        for name in names - known.keys():
            known[name] = None
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.api_fields()}
        out.update(self.extra)
        return out


def decimal(value: Any) -> Decimal | None:
    return None if value is None or value == "" else Decimal(str(value))


@dataclass
class Job(Model):
    id: int
    name: str
    project: str
    labels: dict[str, str]
    image: str
    image_reference: str
    command: list[str]
    env: dict[str, str]
    secret_env: dict[str, str]
    gpu_type: str | None
    gpus_per_node: int
    cpus: int | None
    nodes: int
    region: str
    spot_ratio: str
    priority: str
    max_runtime_minutes: int
    checkpoint_path: str
    checkpoint_keep_last: int | None
    # GPU memory it declared per GPU (GiB), kept free of its pools' memory margin.
    gpu_memory_gib: int | None
    # What its nodes must have: {"interconnect": "nvlink", "cpu_arch": "arm64"}.
    requirements: dict[str, str]
    last_checkpoint_step: int | None
    last_checkpoint_at: str | None
    auto_release: bool
    backend: str
    spot_nodes: int
    on_demand_nodes: int
    simulated: bool  # on the sandbox cluster's simulated nodes: its command is not run
    price_per_hour: str | None  # its run rate, to the cent as an estimate's hourly
    status: str
    status_reason: str
    queue_position: int | None
    # Queued: when it is expected to start; queued or running: when it is expected to end
    # (ISO 8601); the runtime prediction behind them: median_seconds, p90_seconds,
    # samples, basis.
    expected_start: str | None
    expected_end: str | None
    runtime_prediction: dict[str, Any] | None
    # The volumes it mounts, in order: name, path, read_only, region.
    volumes: list[dict[str, Any]]
    attempt: int
    exit_code: int | None
    cost_to_date: str
    currency: str | None  # of price_per_hour and cost_to_date
    created_at: str | None
    started_at: str | None
    finished_at: str | None

    @property
    def total_gpus(self) -> int:
        return (self.gpus_per_node or 0) * (self.nodes or 0)

    @property
    def is_active(self) -> bool:
        return self.status not in FINISHED_STATUSES

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED_STATUSES


@dataclass
class Offer(Model):
    gpu_type: str | None
    region: str
    tier: str
    currency: str
    price_per_gpu_hour: str | None
    price_per_vcpu_hour: str | None
    available_gpus: int
    total_gpus: int
    available_vcpus: int | None
    memory_gib: int | None
    tflops: str | None
    price_per_pflop_hour: str | None
    vcpus_per_node: int
    memory_gib_per_node: int
    price_version: int
    simulated: bool
    isolated_runtime: bool  # every pool serving it runs pods in a sandboxed runtime
    # What every node serving it has (from node labels): nvlink, rdma, infiniband; and
    # their CPU architecture (amd64, arm64; "" if mixed). A job may require them.
    interconnects: list[str]
    cpu_arch: str


@dataclass
class GpuType(Model):
    slug: str
    vendor: str
    model: str
    memory_gib: int
    architecture: str
    interconnect: str
    peak_tflops: Any
    node_label_key: str
    node_label_value: str
    resource_name: str


@dataclass
class NodePool(Model):
    id: int
    slug: str
    name: str
    region: str
    backend: str
    tier: str
    gpu_type: str | None
    node_selector: dict[str, str]
    node_count: int
    gpus_per_node: int
    total_gpus: int
    allocatable_gpus: int
    in_use_gpus: int
    available_gpus: int
    vcpus_per_node: int
    memory_gib_per_node: int
    last_synced_at: str | None
    is_active: bool
    # Preemption policy of the pool (issue 31): the priority gap a waiting job
    # needs before it may preempt, as a decimal string, and whether spot work of
    # other tenants may be preempted.
    preemption_threshold: str
    preempt_other_tenants_spot: bool
    # Share of each GPU's memory kept in reserve for jobs that declare their need.
    memory_margin: str
    # The Kubernetes RuntimeClass of its pods ("" = the nodes' default runtime).
    runtime_class_name: str
    # Weight of data locality against price (1–10, a decimal string): a job that accepts
    # several places counts this pool's price divided by it when the pool is in the
    # job's data region (1.50: it wins unless another costs under two thirds; 1: price).
    locality_weight: str
    # What its nodes have (from their labels), which a job may require.
    interconnects: list[str]  # nvlink, rdma, infiniband
    cpu_arch: str  # amd64, arm64 ("" unknown)
    gpu_memory_gib: int  # per GPU as the nodes report it (0: the GPU type's)
    # Topology: the node label naming a block, and per block its usable and idle nodes.
    topology_label: str
    topology_blocks: dict[str, dict[str, int]]


@dataclass
class Estimate(Model):
    hourly: str
    spot_nodes: int
    on_demand_nodes: int
    split: str
    split_note: str
    total: str
    currency: str
    spot_share: str
    on_demand_share: str
    price_version: int
    units: int
    unit: str
    unit_price_spot: str
    unit_price_base: str
    tenant_discount_percent: str


@dataclass
class Budget(Model):
    id: int
    name: str
    amount: str
    currency: str
    period: str
    thresholds: list[int]
    action: str
    project: str
    webhook_url: str
    created_at: str


@dataclass
class Invoice(Model):
    id: int
    number: str
    tenant: str
    status: str
    period_start: str
    period_end: str
    currency: str
    subtotal: str
    discount: str
    discount_percent: str
    tax: str
    tax_label: str
    tax_rate_percent: str
    rounding: str
    total: str
    credits_applied: str
    amount_credited: str
    amount_due: str
    due_at: str | None
    finalized_at: str | None
    paid_at: str | None
    voided_at: str | None
    created_at: str


@dataclass
class LogLine(Model):
    line_no: int
    rank: int
    text: str
    ts: str | None = None  # when the server read the line (ISO 8601)


@dataclass
class GpuOption(Model):
    """One configuration the GPU recommender proposes: `gpus` GPUs of `gpu_type` in
    `region`, as `nodes` nodes of `gpus_per_node`."""

    gpu_type: str
    gpu_model: str
    gpu_memory_gib: int
    region: str
    tier: str
    gpus: int
    gpus_per_node: int
    nodes: int
    fits: bool
    price_per_hour: str
    currency: str
    available_now: bool
    free_gpus: int
    memory_per_gpu_gib: float


@dataclass
class Recommendation(Model):
    """The GPU recommender's answer: sizes in GiB; `options` fitting first, then cheapest."""

    memory_needed_gib: float
    memory_margin: float
    memory_with_margin_gib: float
    breakdown: dict[str, float]
    model: dict[str, int]
    options: list[GpuOption]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Recommendation:
        recommendation = super().from_dict(data)
        recommendation.options = [GpuOption.from_dict(o) for o in data.get("options") or []]
        return recommendation

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["options"] = [o.to_dict() for o in self.options]
        return out


# OpenAPI component name of each model (tests/sdk/test_schema.py).
@dataclass
class SshKey(Model):
    """One of the caller's SSH public keys; `public_key` is `type base64` (no comment)."""

    id: int
    title: str
    key_type: str
    bits: int
    type_label: str
    public_key: str
    comment: str
    fingerprint: str
    created_at: str
    last_used_at: str | None


@dataclass
class Volume(Model):
    """A named volume of the organisation; `fill` is its latest fill (a copy into it) or
    None: status (queued, running, succeeded, failed, cancelled), source, bytes_done,
    bytes_total (None: unknown), files, error, created_at, started_at, finished_at,
    attempt (runs of the copy: above 1 when it started again after its worker stopped)."""

    id: int
    name: str
    size_gib: int
    region: str
    access: str
    status: str
    created_at: str
    fill: dict[str, Any] | None

    @property
    def filling(self) -> bool:
        return bool(self.fill) and self.fill["status"] in ("queued", "running")


@dataclass
class Service(Model):
    """An inference service: `endpoint_url` is where callers send requests (with a
    service token when `auth` is "token"); `status` deploying, ready, degraded,
    scaled_to_zero, failed or paused (a used-up budget scaled a non-critical service to
    zero; `status_reason` says why)."""

    id: int
    name: str
    image: str
    command: list[str]
    env: dict[str, str]
    secrets: list[str]
    volumes: list[dict[str, Any]]  # {"name", "path"}, mounted read-only
    port: int
    cpus: int
    gpu_type: str | None  # a GPU type's slug (GPU replicas, on a cluster); None: CPU
    gpus_per_replica: int
    region: str
    min_replicas: int
    max_replicas: int
    readiness_path: str
    auth: str
    priority: str
    status: str
    status_reason: str
    revision: int | None
    ready_replicas: int
    replicas: int
    desired_replicas: int
    autoscale: dict[str, Any]
    endpoint_url: str
    created_at: str
    updated_at: str


@dataclass
class ServiceRevision(Model):
    number: int
    image: str
    command: list[str]
    env: dict[str, str]
    secrets: list[str]
    volumes: list[dict[str, Any]]  # {"name", "path"}, mounted read-only
    port: int
    cpus: int
    gpus_per_replica: int
    copied_from: int | None  # the revision a rollback copied
    created_at: str


@dataclass
class ServiceReplica(Model):
    id: int
    revision: int
    state: str  # starting, ready, draining, stopped
    reason: str
    started_at: str | None
    ready_at: str | None


@dataclass
class ServiceScaleEvent(Model):
    """One change of a service's wanted replica count and what decided it: `window` is
    stable, panic, idle, cold_start or bounds; the metric's averages over the stable and
    panic windows; requests held at the gateway; for a cold start, how long the first
    held request waited for a replica."""

    at: str
    from_replicas: int
    to_replicas: int
    window: str
    metric: str
    target: float
    stable_value: float
    panic_value: float
    held_requests: int
    cold_start_seconds: float | None


@dataclass
class ServiceToken(Model):
    """An endpoint token; `token` (the secret) only in `create_token`'s answer."""

    id: int
    name: str
    prefix: str
    created_at: str
    revoked_at: str | None
    token: str | None = None


@dataclass
class Environment(Model):
    """A dev environment: `status` is starting, running, idle_warning, stopping, stopped
    or failed; `ssh_command` is the line to paste (`gpugeek ssh NAME` runs it; empty
    without SSH); `jupyter_url` opens its Jupyter in a browser signed in to the console
    (empty without Jupyter); `idle_stop_at` is when an idle_warning ends in a stop
    unless there is activity."""

    id: int
    name: str
    region: str
    gpu_type: str | None
    gpus_per_node: int
    cpus: int | None
    image: str
    interactive: str
    home_volume: str
    volumes: list[dict[str, Any]]
    env: dict[str, str]
    secrets: list[str]
    idle_policy: dict[str, Any]
    status: str
    status_reason: str
    current_job: int | None
    ssh_command: str
    jupyter_url: str
    ssh_config: str
    ssh_host_key_fingerprint: str
    ssh_known_hosts: str
    last_activity_at: str | None
    keep_alive_until: str | None
    idle_stop_at: str | None
    scheduled_deletion_at: str | None
    created_at: str


SCHEMA_COMPONENTS: dict[type[Model], str] = {
    Job: "Job",
    Offer: "Offer",
    GpuType: "GpuType",
    NodePool: "NodePool",
    Estimate: "Estimate",
    Budget: "Budget",
    Invoice: "Invoice",
    LogLine: "LogLine",
    Recommendation: "Recommendation",
    GpuOption: "GpuOption",
    SshKey: "SshKey",
    Volume: "Volume",
    Service: "Service",
    ServiceRevision: "ServiceRevision",
    ServiceReplica: "ServiceReplica",
    ServiceScaleEvent: "ServiceScaleEvent",
    ServiceToken: "ServiceTokenCreated",
    Environment: "Environment",
}
