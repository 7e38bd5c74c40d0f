"""The rules a service's fields follow (one place for each, used by create, change and
scale in services.services): each refusal is a ServiceError naming the field."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Q

from console.models import Tenant, User
from console.service_errors import ErrorCode, ServiceError
from jobs.extensions import VolumeMount
from jobs.models import Priority
from jobs.services import priority_allowed_check, tenant_secrets_resolve
from jobs.services.spec import ENV_NAME_RE, validate_volume_mounts
from marketplace.models import Backend, GpuType, NodePool, Region, TenantQuota, Tier
from marketplace.selectors import (
    HOST_NOT_AVAILABLE,
    images_for_tenant,
    may_run_on_host,
    pools_for_tenant,
)
from services.models import CLUSTER_METRICS, DNS_LABEL, AutoscaleMetric, ServiceAuth
from storage.volumes import read_only_mounts

# What makes a new revision when it changes.
REVISION_FIELDS = (
    "image",
    "command",
    "env",
    "secrets",
    "volumes",
    "port",
    "cpus",
    "gpus_per_replica",
)


def check_name(name: str) -> None:
    try:
        DNS_LABEL(name)
    except ValidationError:
        raise ServiceError(
            "Use lowercase letters, digits and hyphens for the name (a DNS label, at most "
            "63 characters, not starting or ending with a hyphen).",
            field="name",
        ) from None


def check_runtime(values: dict[str, Any], pool: NodePool) -> None:
    image = values["image"]
    if not isinstance(image, str) or not image.strip() or len(image) > 300:
        raise ServiceError("Give the image to run (at most 300 characters).", field="image")
    command = values["command"]
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(part, str) and part for part in command)
    ):
        raise ServiceError(
            'Give the command as a list of words, e.g. ["python", "serve.py"].',
            field="command",
        )
    port = values["port"]
    if not isinstance(port, int) or not 1 <= port <= 65535:
        raise ServiceError("The port must be between 1 and 65535.", field="port")
    cpus = values["cpus"]
    if not isinstance(cpus, int) or not 1 <= cpus <= max(1, pool.vcpus_per_node):
        raise ServiceError(
            f"Ask for 1 to {max(1, pool.vcpus_per_node)} CPUs per replica.", field="cpus"
        )
    gpus = values["gpus_per_replica"]
    if pool.gpu_type_id is None:
        if gpus != 0:
            raise ServiceError(
                "Name the GPU type (gpu_type) for GPU replicas; without one a service runs "
                "on CPUs.",
                field="gpus_per_replica",
            )
    elif not isinstance(gpus, int) or not 1 <= gpus <= max(1, pool.gpus_per_node):
        raise ServiceError(
            f"Ask for 1 to {max(1, pool.gpus_per_node)} GPUs per replica (a replica runs on "
            "one node).",
            field="gpus_per_replica",
        )
    env = values["env"]
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and ENV_NAME_RE.match(k) and isinstance(v, str) for k, v in env.items()
    ):
        raise ServiceError(
            "Environment variables are NAME: value pairs (letters, digits and _ in names).",
            field="env",
        )
    if len(env) > 200:
        raise ServiceError("At most 200 environment variables.", field="env")
    if "PORT" in env:
        raise ServiceError("PORT is set by the platform; leave it out of env.", field="env")


def check_secrets(*, tenant: Tenant, user: User | None, values: dict[str, Any]) -> None:
    """The named organisation secrets exist and the user may use them (the same rules as
    a job's, in `tenant_secrets_resolve`); none shadows a variable of `env`."""
    names = tenant_secrets_resolve(tenant=tenant, user=user, project="", names=values["secrets"])
    both = sorted(set(names) & set(values["env"]) | set(names) & {"PORT"})
    if both:
        raise ServiceError(
            f"{', '.join(both)} would be set twice: leave it out of env or of secrets.",
            field="secrets",
        )
    values["secrets"] = list(names)


def check_volumes(*, tenant: Tenant, region: Region, values: dict[str, Any]) -> list[VolumeMount]:
    """The volumes every replica mounts read-only (they share them: model weights, a
    dataset): each a volume of the organisation in the service's region, at a path of its
    own (the jobs' rules for paths). `values["volumes"]` becomes [{"name", "path"}]."""
    mounts = validate_volume_mounts(values["volumes"])
    for given in values["volumes"]:
        if given.get("read_only") is False:
            raise ServiceError(
                f"Volume {given['name']}: a service's replicas mount volumes read-only "
                "(they share them); leave read_only out or set it to true.",
                field="volumes",
            )
    values["volumes"] = [{"name": mount["name"], "path": mount["path"]} for mount in mounts]
    return read_only_mounts(tenant=tenant, region=region, mounts=values["volumes"])


def check_gpu_quota(*, tenant: Tenant, pool: NodePool, max_replicas: int, gpus: int) -> None:
    """All of a GPU service's replicas fit its organisation's GPU quotas (of the type, and
    of all types), as a job's GPUs must."""
    if pool.gpu_type_id is None or not gpus:
        return
    quotas = TenantQuota.objects.for_tenant(tenant).filter(
        Q(gpu_type_id=pool.gpu_type_id) | Q(gpu_type=None), max_gpus__isnull=False
    )
    for quota in quotas.order_by("max_gpus"):
        if max_replicas * gpus > quota.max_gpus:
            kind = f"{pool.gpu_type.model} " if quota.gpu_type_id else ""
            raise ServiceError(
                f"{max_replicas} replicas of {gpus} GPU{'s' if gpus > 1 else ''} would hold "
                f"{max_replicas * gpus} GPUs, over your organisation's quota of "
                f"{quota.max_gpus} {kind}GPUs: lower max_replicas or gpus_per_replica.",
                field="max_replicas",
            )


def check_scale(min_replicas: Any, max_replicas: Any) -> None:
    for name, value in (("min_replicas", min_replicas), ("max_replicas", max_replicas)):
        if not isinstance(value, int) or value < 0:
            raise ServiceError(f"{name} must be a whole number, 0 or more.", field=name)
    if max_replicas < 1:
        raise ServiceError("max_replicas must be at least 1.", field="max_replicas")
    if min_replicas > max_replicas:
        raise ServiceError("min_replicas can't be more than max_replicas.", field="min_replicas")
    quota = settings.SERVICE_MAX_REPLICAS
    if max_replicas > quota:
        raise ServiceError(
            f"max_replicas is over your organisation's quota of {quota} replicas per service.",
            field="max_replicas",
        )


MAX_SCALE_DOWN_DELAY = 3600


def check_scale_down_delay(delay: Any) -> None:
    if (
        isinstance(delay, bool)
        or not isinstance(delay, int)
        or not 0 <= delay <= MAX_SCALE_DOWN_DELAY
    ):
        raise ServiceError(
            f"scale_down_delay is a whole number of seconds from 0 to {MAX_SCALE_DOWN_DELAY}.",
            field="scale_down_delay",
        )


def check_autoscale(metric: Any, target: Any, *, pool: NodePool, min_replicas: Any) -> None:
    if metric not in AutoscaleMetric.values:
        raise ServiceError(
            "The autoscale metric is rps (requests per second per replica), concurrency "
            "(requests in flight per replica), or cpu or gpu (utilisation, on a cluster).",
            field="autoscale_metric",
        )
    if metric == AutoscaleMetric.GPU and pool.gpu_type_id is None:
        raise ServiceError(
            "Scaling on GPU utilisation needs GPU replicas: name a gpu_type, or scale on "
            "cpu (on a cluster), rps or concurrency.",
            field="autoscale_metric",
        )
    if metric in CLUSTER_METRICS:
        check_cpu_autoscale(target, pool=pool, min_replicas=min_replicas, metric=metric)
        return
    if (
        isinstance(target, bool)
        or not isinstance(target, int | float)
        or not 0.01 <= target <= 100_000
    ):
        raise ServiceError(
            "The autoscale target is a number of requests per replica, from 0.01 to 100000.",
            field="autoscale_target",
        )


def check_cpu_autoscale(
    target: Any, *, pool: NodePool, min_replicas: Any, metric: str = AutoscaleMetric.CPU
) -> None:
    """CPU or GPU utilisation is the cluster's HorizontalPodAutoscaler's to act on."""
    what = "GPU" if metric == AutoscaleMetric.GPU else "CPU"
    if pool.backend != Backend.KUBERNETES:
        raise ServiceError(
            f"Scaling on {what} utilisation needs a Kubernetes autoscaler, and this service "
            "runs on the console's host: scale on rps or concurrency (measured by the "
            "console's gateway).",
            field="autoscale_metric",
        )
    if min_replicas == 0:
        raise ServiceError(
            f"A service scaled on {what} keeps at least one replica (the cluster's "
            "autoscaler can't scale to zero): set min_replicas to 1 or more, or scale on "
            "rps or concurrency.",
            field="min_replicas",
        )
    if isinstance(target, bool) or not isinstance(target, int | float) or not 1 <= target <= 100:
        raise ServiceError(
            f"The {what} target is a utilisation in percent of the replica's {what}s, from "
            "1 to 100.",
            field="autoscale_target",
        )


def check_image(*, tenant: Tenant, image: str, pool: NodePool) -> None:
    """On a cluster a service runs an image of the catalog (its slug), as jobs do."""
    if pool.backend != Backend.KUBERNETES:
        return  # (on the console's host the command runs in its sandbox, with no image)
    if not images_for_tenant(tenant=tenant).filter(slug=image).exists():
        raise ServiceError(
            f"“{image}” is not an image of the catalog: on a cluster a service runs one "
            "(give its slug, as for a job).",
            field="image",
        )


def check_readiness(path: Any) -> None:
    if not isinstance(path, str) or not path.startswith("/") or len(path) > 200:
        raise ServiceError(
            "The readiness path must start with / (e.g. /healthz).", field="readiness_path"
        )


def check_auth(auth: Any) -> None:
    if auth not in ServiceAuth.values:
        raise ServiceError("auth is either public or token.", field="auth")


def check_priority(*, tenant: Tenant, user: User | None, priority: Any) -> None:
    if priority not in Priority.values:
        raise ServiceError(f"priority is one of {', '.join(Priority.values)}.", field="priority")
    priority_allowed_check(tenant=tenant, user=user, priority=priority)


def service_pool(*, tenant: Tenant, region_slug: str, gpu_type: str | None = None) -> NodePool:
    """The pool a new service's replicas run on. CPU: the region's CPU pool on the
    console's host where it has one, else a CPU pool of its cluster. GPU: a pool of that
    GPU type on the region's cluster (the console's host has no GPU replicas yet).
    On-demand before spot."""
    region = Region.objects.filter(slug=region_slug, is_active=True).first()
    if region is None:
        raise ServiceError(f"There is no region “{region_slug}”.", field="region")
    if gpu_type:
        return _gpu_pool(tenant=tenant, region=region, gpu_type=gpu_type)
    cpu_pools = NodePool.objects.filter(region=region, gpu_type__isnull=True, is_active=True)
    pools = cpu_pools.filter(on_console_host=True)
    if pools.exists():
        if not may_run_on_host(tenant):
            raise ServiceError(HOST_NOT_AVAILABLE, code=ErrorCode.FORBIDDEN, field="region")
    else:
        pools = cpu_pools.filter(backend=Backend.KUBERNETES)
    open_pools = pools_for_tenant(tenant).filter(pk__in=pools.values("pk"))
    pool = sorted(open_pools, key=lambda p: (p.tier == Tier.SPOT, p.pk))[:1]
    if not pool:
        raise ServiceError(
            f"Services can't run in {region.name}: it has no CPU pool open to your organisation.",
            field="region",
        )
    return pool[0]


def _gpu_pool(*, tenant: Tenant, region: Region, gpu_type: str) -> NodePool:
    if not isinstance(gpu_type, str) or not GpuType.objects.filter(slug=gpu_type).exists():
        raise ServiceError(f"There is no GPU type “{gpu_type}”.", field="gpu_type")
    pools = NodePool.objects.filter(region=region, gpu_type__slug=gpu_type, is_active=True)
    on_cluster = pools.filter(backend=Backend.KUBERNETES, on_console_host=False)
    if pools.exists() and not on_cluster.exists():
        raise ServiceError(
            f"GPU replicas run on a Kubernetes cluster, and {region.name} has {gpu_type} "
            "GPUs only on the console's host: pick a region whose cluster has them.",
            field="gpu_type",
        )
    open_pools = pools_for_tenant(tenant).filter(pk__in=on_cluster.values("pk"))
    pool = sorted(open_pools.select_related("gpu_type"), key=lambda p: (p.tier == Tier.SPOT, p.pk))
    if not pool:
        raise ServiceError(
            f"{region.name} has no {gpu_type} pool open to your organisation.", field="gpu_type"
        )
    return pool[0]
