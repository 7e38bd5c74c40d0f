"""Turning the documented launch spelling into the API's job fields.

`{"gpu_type": "A100-80GB", "count": 16, ...}` becomes `gpu_type: "a100-80gb"`,
`nodes: 2, gpus_per_node: 8` (on 8-GPU nodes): the GPU type is matched against the
catalog (`GET /gpu-types`), the per-node GPU count read from the pools that offer it
(`GET /pools`). The API's own fields pass through unchanged."""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from gpugeek.errors import GpuGeekError, UsageError, ValidationError

if TYPE_CHECKING:
    from gpugeek.client import Client

JOB_FIELDS = frozenset(
    {
        "name", "project", "labels", "image", "command", "env", "secret_env", "gpu_type",
        "gpus_per_node", "cpus", "nodes", "region", "spot_ratio", "priority",
        "max_runtime_minutes", "checkpoint_path", "checkpoint_keep_last", "gpu_memory_gib",
        "auto_release", "ports", "secrets", "volumes", "regions", "gpu_types", "data_region",
        "requirements",
    }
)  # fmt: skip
# What a job may require of its nodes (the server's jobs.services.placement.
# REQUIREMENT_VALUES; tests/sdk check they agree): checked here so a script hears of a
# typo before a request.
REQUIREMENT_VALUES = {
    "interconnect": ("nvlink", "rdma", "infiniband"),
    "cpu_arch": ("amd64", "arm64"),
}

# The server's one node limit (marketplace.pricing.MAX_NODES; tests/sdk check they agree),
# checked here so a script hears of it before a request, under the name it wrote.
MAX_NODES = 1024


def nodes_check(nodes: Any, *, used_count: bool) -> None:
    """Refuse more nodes than one job (or estimate) may have."""
    if isinstance(nodes, int) and nodes > MAX_NODES:
        field = "count" if used_count else "nodes"
        message = f"At most {MAX_NODES:,} nodes" + (
            f"; this count needs {nodes:,}." if used_count else f", not {nodes:,}."
        )
        raise ValidationError(message, errors={field: [message]})


def parse_env(items: list[str]) -> dict[str, str]:
    """The CLI's repeated `--env KEY=VALUE` as an environment."""
    env = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise UsageError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    return env


def parse_volume(text: str) -> dict[str, Any]:
    """`data:/data` or `data:/data:ro` (the CLI's --volume) as a spec's volume mount."""
    name, _, rest = text.partition(":")
    path, read_only = rest, False
    if rest.endswith((":ro", ":rw")):
        path, read_only = rest[:-3], rest.endswith(":ro")
    if not name or not path.startswith("/"):
        raise ValidationError(
            f"--volume {text!r}: write NAME:/PATH or NAME:/PATH:ro.",
            code="invalid",
            errors={"volumes": [f"{text!r} is not NAME:/PATH[:ro]."]},
        )
    return {"name": name, "path": path, "read_only": read_only}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def resolve_gpu_type(client: Client, name: str) -> str:
    """The catalog slug for a GPU type spelled as a slug, "A100-80GB" or "A100 80GB SXM"."""
    types = client.gpu_types()
    for gpu in types:
        if gpu.slug == name:
            return gpu.slug
    wanted = _norm(name)
    for gpu in types:
        if _norm(gpu.slug) == wanted or _norm(gpu.model) == wanted:
            return gpu.slug
    prefixed = [g.slug for g in types if _norm(g.model).startswith(wanted)]
    if len(prefixed) == 1:
        return prefixed[0]
    known = ", ".join(sorted(g.slug for g in types))
    raise ValidationError(
        f"Unknown GPU type {name!r} (known: {known}).",
        code="invalid",
        errors={"gpu_type": [f"Unknown GPU type {name!r}."]},
    )


def split_count(client: Client, gpu_type: str, count: int, region: str | None) -> tuple[int, int]:
    """(nodes, gpus_per_node) for `count` GPUs of `gpu_type` on the pools that offer it."""
    if count < 1:
        raise ValidationError("count is at least 1.", errors={"count": ["At least 1."]})
    pools = [p for p in client.pools() if p.gpu_type == gpu_type and p.gpus_per_node]
    if region:
        pools = [p for p in pools if p.region == region]
    if not pools:
        where = f" in {region}" if region else ""
        raise ValidationError(
            f"No pool offers {gpu_type}{where}.", errors={"gpu_type": [f"Not offered{where}."]}
        )
    sizes = sorted({p.gpus_per_node for p in pools}, reverse=True)
    for per_node in sizes:
        if count <= per_node:
            continue
        if count % per_node == 0:
            return count // per_node, per_node
    fitting = [s for s in sizes if count <= s]
    if fitting:
        return 1, count
    raise ValidationError(
        f"{count} GPUs don't split evenly over nodes of {', '.join(map(str, sizes))} GPUs.",
        errors={
            "count": [
                f"{count} GPUs don't fill whole nodes of {sizes[0]} GPUs: ask for "
                f"{sizes[0]} or fewer, or a multiple of {sizes[0]}."
            ]
        },
    )


# The API's fields a `count` is split into: the server's errors on them are `count`'s.
COUNT_SPLIT_FIELDS = ("nodes", "gpus_per_node")


@contextmanager
def errors_named_count(used_count: bool) -> Iterator[None]:
    """A request that gave `count` hears of its errors under that name, not under the
    `nodes` and `gpus_per_node` it was split into (which it never wrote)."""
    try:
        yield
    except GpuGeekError as error:
        if used_count and error.errors:
            moved = [m for name in COUNT_SPLIT_FIELDS for m in error.errors.pop(name, [])]
            if moved:
                error.errors["count"] = [*error.errors.get("count", []), *moved]
        raise


def job_payload(client: Client, spec: dict[str, Any]) -> dict[str, Any]:
    """The POST /jobs body for a spec in either spelling."""
    spec = dict(spec)
    count = spec.pop("count", None)
    unknown = set(spec) - JOB_FIELDS
    if unknown:
        raise ValidationError(
            f"Unknown field(s): {', '.join(sorted(unknown))}.",
            errors={k: ["Unknown field."] for k in sorted(unknown)},
        )
    if isinstance(spec.get("command"), str):
        spec["command"] = split_command(spec["command"])
    if spec.get("gpu_type"):
        spec["gpu_type"] = resolve_gpu_type(client, str(spec["gpu_type"]))
    if spec.get("gpu_types"):
        spec["gpu_types"] = [resolve_gpu_type(client, str(g)) for g in spec["gpu_types"]]
    if spec.get("requirements"):
        requirements_check(spec["requirements"])
    if count is not None:
        if spec.get("gpu_types"):
            raise ValidationError(
                "count is split over one GPU type's nodes; with gpu_types give nodes and "
                "gpus_per_node.",
                errors={"count": ["Not with gpu_types."]},
            )
        if not spec.get("gpu_type"):
            raise ValidationError(
                "count needs a gpu_type.", errors={"count": ["Give gpu_type with count."]}
            )
        if "nodes" in spec or "gpus_per_node" in spec:
            raise ValidationError(
                "Give count, or nodes and gpus_per_node, not both.",
                errors={"count": ["Not with nodes/gpus_per_node."]},
            )
        spec["nodes"], spec["gpus_per_node"] = split_count(
            client, spec["gpu_type"], int(count), spec.get("region")
        )
    elif (spec.get("gpu_type") or spec.get("gpu_types")) and not spec.get("gpus_per_node"):
        spec["gpus_per_node"] = 1
    nodes_check(spec.get("nodes"), used_count=count is not None)
    if "spot_ratio" in spec and spec["spot_ratio"] is not None:
        spec["spot_ratio"] = str(spec["spot_ratio"])
    if not spec.get("name"):
        spec["name"] = default_name(spec)
    return spec


def requirements_check(requirements: Any) -> None:
    """Refuse a requirement the server doesn't know, under `requirements`."""
    problems = []
    if not isinstance(requirements, dict):
        problems = ['An object, e.g. {"interconnect": "nvlink"}.']
    else:
        for name, value in requirements.items():
            allowed = REQUIREMENT_VALUES.get(name)
            if allowed is None:
                problems.append(f"Unknown requirement {name!r}: {', '.join(REQUIREMENT_VALUES)}.")
            elif value not in allowed:
                problems.append(f"{name} {value!r}: one of {', '.join(allowed)}.")
    if problems:
        raise ValidationError(" ".join(problems), errors={"requirements": problems})


def split_command(command: str) -> list[str]:
    """A command string split as a shell would (never run by one)."""
    try:
        return shlex.split(command)
    except ValueError as error:  # "No closing quotation", "No escaped character"
        message = f"The command can't be split like a shell would: {str(error).lower()}."
        raise ValidationError(message, errors={"command": [message]}) from None


def default_name(spec: dict[str, Any]) -> str:
    """A job name for a spec without one: what it runs (the script, else the program,
    else the image) and a short random suffix, so two launches are told apart."""
    argv = [str(arg) for arg in spec.get("command") or []]
    scripts = [arg for arg in argv if re.search(r"\.(py|sh|ipynb)$", arg)]
    what = scripts[0] if scripts else (argv[0] if argv else str(spec.get("image") or "job"))
    words = re.sub(r"[^a-z0-9]+", "-", what.rsplit("/", 1)[-1].lower()).strip("-") or "job"
    return f"{words[:60]}-{secrets.token_hex(3)}"
