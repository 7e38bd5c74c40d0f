"""A launch request (`JobSpec`): its validation against the catalog, pools and quota
maxima, and where it would be placed. Pure reads; nothing here writes."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from decimal import Decimal

from django.db.models import F

from console.crypto import decrypt_json
from console.models import Tenant
from console.service_errors import ServiceError
from jobs.extensions import volume_provider
from jobs.models import Job, Priority
from jobs.services.placement import (
    JobShape,
    PlacementChoice,
    placement_choose,
    validate_requirements,
)
from marketplace.models import GpuType, Image, NodePool, Region, TenantQuota
from marketplace.pricing import MAX_NODES, node_split
from marketplace.selectors import HOST_NOT_AVAILABLE, regions_for_tenant

ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
RESERVED_ENV_PREFIXES = ("GPUGEEK_",)
# Kubernetes label syntax: a name (≤ 63: alphanumeric at both ends, . _ - inside), a key
# may have a DNS-subdomain prefix and "/", a value is a name or empty.
LABEL_NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
LABEL_PREFIX_RE = re.compile(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$"
)
# Spec sizes: a spec is stored in the job row and handed to a backend (a pod manifest, a
# process's argv and environment); these bounds keep one launch from filling either.
MAX_COMMAND_ARGS = 256
MAX_COMMAND_ARG_BYTES = 8 * 1024
MAX_ENV_VARS = 128
MAX_ENV_NAME_LENGTH = 100
MAX_ENV_VALUE_BYTES = 32 * 1024
# What a job's environment holds in all: env, secret_env and the organisation secrets
# it names, together.
MAX_ENV_TOTAL_BYTES = 128 * 1024
MAX_JOB_SECRETS = 32  # organisation secrets one job may name
MAX_LABELS = 32
MAX_ACCEPTABLE = 8  # regions, GPU types one spec may accept (each place is priced)


# The one default: the launch form, the API, the SDK and the CLI (which send none) use it.
DEFAULT_MAX_RUNTIME_MINUTES = 24 * 60


@dataclass
class JobSpec:
    """What a user asks to run; validated by `spec_validate`."""

    name: str
    image: str
    command: list[str]
    nodes: int = 1
    gpus_per_node: int = 0
    gpu_type: str | None = None
    cpus: int | None = None
    region: str | None = None
    spot_ratio: Decimal = Decimal(0)
    priority: str = Priority.NORMAL
    max_runtime_minutes: int = DEFAULT_MAX_RUNTIME_MINUTES
    checkpoint_path: str = ""
    # Complete checkpoints kept in the store; None: the installation's CHECKPOINT_KEEP_LAST.
    checkpoint_keep_last: int | None = None
    # GPU memory needed per GPU (GiB), kept free of the pool's memory_margin; None: not said.
    gpu_memory_gib: int | None = None
    project: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict)
    auto_release: bool = True
    ports: list[dict] = field(default_factory=list)
    # Names of tenant secrets to inject as environment variables of the same name.
    secrets: list[str] = field(default_factory=list)
    # Volumes to mount: [{"name": "data", "path": "/data", "read_only": False}].
    volumes: list[dict] = field(default_factory=list)
    # Several acceptable places instead of one `region` / `gpu_type` (never both forms):
    # launch takes the cheapest weighted by data locality (jobs.services.placement).
    regions: list[str] = field(default_factory=list)
    gpu_types: list[str] = field(default_factory=list)
    # Where the data it reads lives (e.g. its bucket's region) when it mounts no volumes.
    data_region: str | None = None
    # What its nodes must have: {"interconnect": "nvlink", "cpu_arch": "arm64"}.
    requirements: dict[str, str] = field(default_factory=dict)


@dataclass
class Placement:
    backend: str
    pool: NodePool | None
    spot_pool: NodePool | None
    spot_nodes: int
    on_demand_nodes: int


def invalid(message: str, field_name: str) -> ServiceError:
    return ServiceError(message, field=field_name)


def validate_env(env: dict, field_name: str) -> dict[str, str]:
    if not isinstance(env, dict):
        raise invalid("Environment variables are an object of NAME: value.", field_name)
    if len(env) > MAX_ENV_VARS:
        raise invalid(f"At most {MAX_ENV_VARS} variables ({len(env)} given).", field_name)
    clean = {}
    for key, value in env.items():
        if isinstance(key, str) and len(key) > MAX_ENV_NAME_LENGTH:
            raise invalid(
                f"{key[:20]}…: variable names are at most {MAX_ENV_NAME_LENGTH} characters.",
                field_name,
            )
        if not isinstance(key, str) or not ENV_NAME_RE.match(key):
            raise invalid(
                f"“{key}” is not a valid variable name (letters, digits, _; not "
                "starting with a digit).",
                field_name,
            )
        if key.startswith(RESERVED_ENV_PREFIXES):
            raise invalid(
                f"{key}: names starting with GPUGEEK_ are set by the platform.", field_name
            )
        if not isinstance(value, (str, int, float, bool)):
            raise invalid(f"{key}: values are strings.", field_name)
        clean[key] = str(value)
        if _size(clean[key]) > MAX_ENV_VALUE_BYTES:
            raise invalid(
                f"{key}: a value is at most {MAX_ENV_VALUE_BYTES // 1024} KiB.", field_name
            )
    return clean


def validate_secret_names(names) -> list[str]:
    """The organisation secrets a spec names, each once; at most MAX_JOB_SECRETS."""
    if not isinstance(names, list | tuple) or not all(isinstance(n, str) for n in names):
        raise invalid("Secrets are a list of organisation secret names.", "secrets")
    unique = list(dict.fromkeys(names))
    if len(unique) > MAX_JOB_SECRETS:
        raise invalid(
            f"A job uses at most {MAX_JOB_SECRETS} organisation secrets ({len(unique)} named).",
            "secrets",
        )
    return unique


def _validate_environment(
    *, env: dict[str, str], secret_env: dict[str, str], organisation_secrets: dict[str, str]
) -> None:
    """The bounds of a job's whole environment: its variables, its secret variables and
    the organisation secrets it names, counted as the job gets them (a secret variable
    of the spec overrides an organisation secret of the same name). The field at fault
    is the one whose values push it over the bound."""
    secrets = {**organisation_secrets, **secret_env}
    own_count, own_bytes = len(env) + len(secret_env), _env_bytes(env) + _env_bytes(secret_env)
    own_field = "secret_env" if secret_env else "env"
    if len(env) + len(secrets) > MAX_ENV_VARS:
        raise invalid(
            f"At most {MAX_ENV_VARS} variables in all, plain and secret together "
            "(organisation secrets included).",
            own_field if own_count > MAX_ENV_VARS else "secrets",
        )
    total = _env_bytes(env) + _env_bytes(secrets)
    if total > MAX_ENV_TOTAL_BYTES:
        raise invalid(
            f"The environment (plain and secret together, organisation secrets included) "
            f"is at most {MAX_ENV_TOTAL_BYTES // 1024} KiB; this one is {total} bytes.",
            own_field if own_bytes > MAX_ENV_TOTAL_BYTES else "secrets",
        )


def _size(text: str) -> int:
    """Bytes as the job will get them (UTF-8)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _env_bytes(env: dict[str, str]) -> int:
    return sum(_size(key) + 1 + _size(value) for key, value in env.items())


def _validate_command(command) -> None:
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(arg, str) for arg in command)
    ):
        raise invalid(
            "The command is a non-empty list of strings (argv); it is never run through a shell.",
            "command",
        )
    if len(command) > MAX_COMMAND_ARGS:
        raise invalid(
            f"The command has at most {MAX_COMMAND_ARGS} arguments ({len(command)} given).",
            "command",
        )
    if any(_size(arg) > MAX_COMMAND_ARG_BYTES for arg in command):
        raise invalid(
            f"Each command argument is at most {MAX_COMMAND_ARG_BYTES // 1024} KiB.", "command"
        )
    if any("\x00" in arg for arg in command):
        raise invalid("The command contains NUL bytes.", "command")


def _label_key_ok(key) -> bool:
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and not (len(prefix) <= 253 and LABEL_PREFIX_RE.match(prefix)):
        return False
    return bool(LABEL_NAME_RE.match(name))


def _validate_labels(labels) -> None:
    if not isinstance(labels, dict):
        raise invalid("Labels are an object of key: value strings.", "labels")
    if len(labels) > MAX_LABELS:
        raise invalid(f"At most {MAX_LABELS} labels ({len(labels)} given).", "labels")
    for key, value in labels.items():
        if not _label_key_ok(key):
            raise invalid(
                f"Label key “{str(key)[:80]}”: an optional DNS prefix and “/”, then up to 63 "
                "letters, digits, . _ - starting and ending with a letter or digit.",
                "labels",
            )
        if not isinstance(value, str) or not (value == "" or LABEL_NAME_RE.match(value)):
            raise invalid(
                f"Label {key}: the value is empty or up to 63 letters, digits, . _ - starting "
                "and ending with a letter or digit.",
                "labels",
            )


MAX_CHECKPOINT_PATH_LENGTH = 400


def _validate_checkpoint_path(path) -> None:
    """Where the job keeps its checkpoints (a path, or a URL such as s3://bucket/run),
    handed to it as GPUGEEK_CHECKPOINT_PATH: no control characters (a NUL or a newline
    breaks an environment), and no `..` segment, so it never names a place outside the
    one it appears to."""
    if not isinstance(path, str) or len(path) > MAX_CHECKPOINT_PATH_LENGTH:
        raise invalid(
            f"The checkpoint path is at most {MAX_CHECKPOINT_PATH_LENGTH} characters.",
            "checkpoint_path",
        )
    if any(ord(char) < 32 or ord(char) == 127 for char in path):
        raise invalid("The checkpoint path contains control characters.", "checkpoint_path")
    if ".." in re.split(r"[/\\]", path):
        raise invalid("The checkpoint path can't contain “..” segments.", "checkpoint_path")


MAX_CHECKPOINT_KEEP_LAST = 100


def _validate_keep_last(keep_last) -> None:
    """At least one: the newest complete checkpoint is what a next attempt resumes from."""
    if keep_last is None:
        return
    if (
        isinstance(keep_last, bool)
        or not isinstance(keep_last, int)
        or not 1 <= keep_last <= MAX_CHECKPOINT_KEEP_LAST
    ):
        raise invalid(
            f"Checkpoints kept is a whole number from 1 to {MAX_CHECKPOINT_KEEP_LAST}.",
            "checkpoint_keep_last",
        )


MAX_GPU_MEMORY_GIB = 4096


def _validate_gpu_memory(gpu_memory_gib, gpu_type) -> None:
    if gpu_memory_gib is None:
        return
    if (
        isinstance(gpu_memory_gib, bool)
        or not isinstance(gpu_memory_gib, int)
        or not 1 <= gpu_memory_gib <= MAX_GPU_MEMORY_GIB
    ):
        raise invalid(
            f"GPU memory per GPU is a whole number of GiB from 1 to {MAX_GPU_MEMORY_GIB}.",
            "gpu_memory_gib",
        )
    if gpu_type is None:
        raise invalid("GPU memory is declared only for a GPU job.", "gpu_memory_gib")


PORT_NAME_RE = re.compile(r"^[a-z]([a-z0-9-]{0,13}[a-z0-9])?$")


def _validate_ports(ports) -> None:
    """Ports to expose (Jupyter, SSH…): [{"name": "jupyter", "port": 8888}], at most 8."""
    if not isinstance(ports, list) or len(ports) > 8:
        raise invalid("Ports are a list of at most 8 {name, port} objects.", "ports")
    names, numbers = set(), set()
    for port in ports:
        if not isinstance(port, dict) or set(port) != {"name", "port"}:
            raise invalid('Each port is {"name": "jupyter", "port": 8888}.', "ports")
        name, number = port["name"], port["port"]
        if not isinstance(name, str) or not PORT_NAME_RE.match(name):
            raise invalid(
                f"Port name “{name}”: lower-case letters, digits and -, up to 15.", "ports"
            )
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 65535:
            raise invalid(f"Port {number!r} is not a TCP port number.", "ports")
        if number == 29500 or name in names or number in numbers:
            raise invalid(
                f"Port {name}/{number} clashes with another (29500 is rendezvous).", "ports"
            )
        names.add(name)
        numbers.add(number)


MAX_VOLUME_MOUNTS = 16
VOLUME_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
# The kernel's and the runtime's: a volume over one of them would hide or replace it.
FORBIDDEN_MOUNT_ROOTS = ("/proc", "/sys", "/dev")


def validate_volume_mounts(volumes) -> list[dict]:
    """The shape of a spec's volume mounts: each names a volume once, at an absolute,
    normal path outside /proc, /sys and /dev, no two at one path. Whether the volumes
    exist and may be mounted so is the volume provider's to say (`check_mounts`)."""
    if not isinstance(volumes, list) or len(volumes) > MAX_VOLUME_MOUNTS:
        raise invalid(
            f'Volumes are a list of at most {MAX_VOLUME_MOUNTS} {{"name", "path", '
            '"read_only"}} objects.',
            "volumes",
        )
    clean: list[dict] = []
    for mount in volumes:
        if not isinstance(mount, dict) or not {"name", "path"} <= set(mount) <= {
            "name",
            "path",
            "read_only",
        }:
            raise invalid('Each volume is {"name": "data", "path": "/data", "read_only": false}.',
                          "volumes")  # fmt: skip
        name, path, read_only = mount["name"], mount["path"], mount.get("read_only", False)
        if not isinstance(name, str) or not VOLUME_NAME_RE.match(name):
            raise invalid(f"“{str(name)[:80]}” is not a volume name.", "volumes")
        if not isinstance(read_only, bool):
            raise invalid(f"Volume {name}: read_only is true or false.", "volumes")
        if (
            not isinstance(path, str)
            or not path.startswith("/")
            or len(path) > 400
            or any(ord(char) < 32 or ord(char) == 127 for char in path)
            or posixpath.normpath(path) != path
            or path.startswith("//")
        ):
            raise invalid(
                f"Volume {name}: the mount path is an absolute path such as /data "
                "(no “..”, no trailing /).",
                "volumes",
            )
        if path == "/" or any(
            path == root or path.startswith(f"{root}/") for root in FORBIDDEN_MOUNT_ROOTS
        ):
            raise invalid(
                f"Volume {name}: a volume can't be mounted at {path} (/, /proc, /sys and "
                "/dev belong to the system).",
                "volumes",
            )
        if any(other["path"] == path for other in clean):
            raise invalid(f"Two volumes are mounted at {path}.", "volumes")
        if any(other["name"] == name for other in clean):
            raise invalid(f"Volume {name} is mounted twice; mount it once.", "volumes")
        clean.append({"name": name, "path": path, "read_only": read_only})
    return clean


@dataclass
class ResolvedSpec:
    spec: JobSpec
    image: Image
    gpu_type: GpuType | None
    region: Region
    cpus: int
    requirements: dict[str, str]
    placement: Placement
    choice: PlacementChoice  # how region and GPU type were chosen, for the timeline
    quotas: list[TenantQuota]  # the tenant's, as validation read them


def spec_validate(
    *, tenant: Tenant, spec: JobSpec, organisation_secrets: dict[str, str] | None = None
) -> ResolvedSpec:
    """Check a spec against the catalog, pools and quota maxima, and place it: of the
    regions and GPU types it accepts, where it runs (jobs.services.placement). Raises
    ServiceError with the field at fault; a request that fits the limits but not the free
    capacity is valid (it queues). `organisation_secrets` are the values of the secrets
    the spec names (`tenant_secrets_resolve`): they count toward the environment's bounds."""
    name = (spec.name or "").strip()
    if not name or len(name) > 100:
        raise invalid("Give the job a name (up to 100 characters).", "name")
    _validate_command(spec.command)
    if spec.nodes < 1:
        raise invalid("Ask for at least one node.", "nodes")
    if spec.nodes > MAX_NODES:
        raise invalid(f"Ask for at most {MAX_NODES:,} nodes.", "nodes")
    if spec.gpus_per_node < 0:
        raise invalid("GPUs per node can't be negative.", "gpus_per_node")
    if not Decimal(0) <= Decimal(spec.spot_ratio) <= Decimal(1):
        raise invalid("The spot ratio is between 0 and 1.", "spot_ratio")
    if spec.max_runtime_minutes is None or spec.max_runtime_minutes <= 0:
        raise invalid("The maximum runtime must be more than zero minutes.", "max_runtime_minutes")
    if spec.priority not in Priority.values:
        raise invalid("Priority is critical, normal or low.", "priority")
    _validate_labels(spec.labels)
    env = validate_env(spec.env, "env")
    secret_env = validate_env(spec.secret_env, "secret_env")
    validate_secret_names(spec.secrets)
    _validate_environment(
        env=env, secret_env=secret_env, organisation_secrets=organisation_secrets or {}
    )
    _validate_ports(spec.ports)
    _validate_checkpoint_path(spec.checkpoint_path)
    _validate_keep_last(spec.checkpoint_keep_last)
    spec.volumes = validate_volume_mounts(spec.volumes)
    overlap = set(spec.env) & set(spec.secret_env)
    if overlap:
        raise invalid(f"{', '.join(sorted(overlap))} is both plain and secret.", "secret_env")

    requirements = validate_requirements(spec.requirements)
    gpu_types = _acceptable_gpu_types(spec)
    regions = _acceptable_regions(tenant, spec)
    data_region = None
    if spec.data_region:
        data_region = regions_for_tenant(tenant).filter(slug=spec.data_region).first()
        if data_region is None:
            raise invalid(f"Unknown region “{spec.data_region}”.", "data_region")

    image = (
        Image.objects.for_tenant(tenant)
        .filter(slug=spec.image, is_active=True)
        .order_by(F("tenant").asc(nulls_first=True))  # a public image wins a slug clash
        .first()
    )
    if image is None:
        raise invalid(f"Unknown image “{spec.image}”.", "image")
    _validate_gpu_memory(spec.gpu_memory_gib, gpu_types[0])

    # The estimate's rule (marketplace.pricing.node_split): a launch is what was priced.
    split = node_split(nodes=spec.nodes, spot_ratio=Decimal(spec.spot_ratio))
    quotas = list(TenantQuota.objects.for_tenant(tenant).order_by("pk"))
    choice = placement_choose(
        tenant=tenant,
        shape=JobShape(
            nodes=spec.nodes,
            gpus_per_node=spec.gpus_per_node,
            cpus=spec.cpus,
            split=split,
            gpu_memory_gib=spec.gpu_memory_gib,
            mounts=spec.volumes,
            requirements=requirements,
            region_field="regions" if spec.regions else "region",
            gpu_type_field="gpu_types" if spec.gpu_types else "gpu_type",
        ),
        gpu_types=gpu_types,
        regions=regions,
        image=image,
        data_region=data_region,
        quotas=quotas,
    )
    chosen = choice.chosen
    return ResolvedSpec(
        spec=spec,
        image=image,
        gpu_type=chosen.gpu_type,
        region=chosen.region,
        cpus=chosen.cpus,
        requirements=requirements,
        placement=Placement(
            backend=chosen.main_pool.backend,
            pool=chosen.pool,
            spot_pool=chosen.spot_pool,
            spot_nodes=split.spot_nodes,
            on_demand_nodes=split.on_demand_nodes,
        ),
        choice=choice,
        quotas=quotas,
    )


def _acceptable_gpu_types(spec: JobSpec) -> list[GpuType | None]:
    """The GPU types the job may run on (`gpu_type`, or several in `gpu_types`); [None]
    for a CPU job."""
    if spec.gpu_type and spec.gpu_types:
        raise invalid("Give gpu_type or gpu_types, not both.", "gpu_types")
    field_name = "gpu_types" if spec.gpu_types else "gpu_type"
    slugs = _slug_list(spec.gpu_types or [], field_name)
    slugs = slugs or ([spec.gpu_type] if spec.gpu_type else [])
    if not slugs:
        if spec.gpus_per_node:
            raise invalid("Choose a GPU type for a GPU job.", "gpu_type")
        return [None]
    found = {g.slug: g for g in GpuType.objects.filter(slug__in=slugs, is_active=True)}
    for slug in slugs:
        if slug not in found:
            raise invalid(f"Unknown GPU type “{slug}”.", field_name)
    if spec.gpus_per_node < 1:
        raise invalid("A GPU job needs at least one GPU per node.", "gpus_per_node")
    return [found[slug] for slug in slugs]


def _acceptable_regions(tenant: Tenant, spec: JobSpec) -> list[Region]:
    """The regions the job may run in (`region`, or several in `regions`); [] when it
    names none: each GPU type's default region then (jobs.services.placement)."""
    if spec.region and spec.regions:
        raise invalid("Give region or regions, not both.", "regions")
    field_name = "regions" if spec.regions else "region"
    slugs = _slug_list(spec.regions or [], field_name)
    slugs = slugs or ([spec.region] if spec.region else [])
    if not slugs:
        return []
    # One query when the regions are usable; telling why not costs a second.
    found = {r.slug: r for r in regions_for_tenant(tenant).filter(slug__in=slugs)}
    for slug in slugs:
        if slug not in found:
            if Region.objects.filter(slug=slug, is_active=True).exists():
                raise invalid(HOST_NOT_AVAILABLE, field_name)
            raise invalid(f"Unknown region “{slug}”.", field_name)
    return [found[slug] for slug in slugs]


def _slug_list(slugs, field_name: str) -> list[str]:
    """A spec's list of acceptable regions or GPU types: slugs, each once, at most
    MAX_ACCEPTABLE (each place is priced at launch)."""
    if not isinstance(slugs, list | tuple) or not all(isinstance(s, str) and s for s in slugs):
        raise invalid("A list of slugs.", field_name)
    unique = list(dict.fromkeys(slugs))
    if len(unique) > MAX_ACCEPTABLE:
        raise invalid(f"At most {MAX_ACCEPTABLE} ({len(unique)} given).", field_name)
    return unique


def spec_from_job(job: Job) -> JobSpec:
    return JobSpec(
        name=job.name,
        image=job.image.slug,
        command=list(job.command),
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        gpu_type=job.gpu_type.slug if job.gpu_type else None,
        cpus=job.cpus,
        region=job.region.slug,
        spot_ratio=job.spot_ratio,
        priority=job.priority,
        max_runtime_minutes=job.max_runtime_minutes,
        checkpoint_path=job.checkpoint_path,
        checkpoint_keep_last=job.checkpoint_keep_last,
        gpu_memory_gib=job.gpu_memory_gib,
        project=job.project,
        labels=dict(job.labels),
        env=dict(job.env),
        secret_env=decrypt_json(job.secret_env_encrypted),
        auto_release=job.auto_release,
        ports=list(job.ports),
        volumes=[
            {"name": mount.name, "path": mount.path, "read_only": mount.read_only}
            for mount in volume_provider().mounts_for(job)
        ],
        requirements=dict(job.requirements),
    )
