"""Chaos controls of a simulated backend (the sandbox cluster), as staff use them.

Each action is refused with a clear message where no simulated backend is configured or
the request doesn't fit it, and is audited with the staff user. What follows (pods
disrupted, API errors) reaches the console through the real paths: the watcher, the
reconciler, preemption and requeue.
"""

from __future__ import annotations

from django.http import HttpRequest

from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from jobs.backends import BackendUnavailable, configured_backends
from jobs.backends.base import ChaosControls, ChaosRefused
from marketplace.models import NodePool, Tier

API_FAULT_MODES = ("error", "slow")


def chaos_available() -> ChaosControls | None:
    """The chaos controls of the first configured backend that has them."""
    for backend in configured_backends():
        controls = backend.chaos()
        if controls is not None:
            return controls
    return None


def _controls() -> ChaosControls:
    controls = chaos_available()
    if controls is None:
        raise ServiceError(
            "No simulated cluster is running: chaos controls exist only for the sandbox "
            "cluster (SANDBOX_CLUSTER, started by runconsole).",
            code=ErrorCode.CONFLICT,
        )
    return controls


def _carry_out(action, *args, **kwargs):
    try:
        return action(*args, **kwargs)
    except ChaosRefused as error:
        raise ServiceError(str(error)) from error
    except BackendUnavailable as error:
        raise ServiceError(str(error), code=ErrorCode.CONFLICT) from error


def chaos_nodes() -> list[dict]:
    return _carry_out(_controls().nodes)


def chaos_reclaim_spot(*, pool: NodePool, request: HttpRequest) -> dict:
    if pool.tier != Tier.SPOT or not pool.simulated:
        raise ServiceError(f"{pool} is not a spot pool of the sandbox cluster.")
    outcome = _carry_out(_controls().reclaim_spot, pool.slug)
    audit_record(
        action="sandbox.spot_reclaimed",
        target=pool,
        request=request,
        metadata={"evicted_pods": len(outcome.get("evicted_pods", []))},
    )
    return outcome


def chaos_node_fail(*, node: str, request: HttpRequest) -> dict:
    outcome = _carry_out(_controls().fail_node, node)
    audit_record(
        action="sandbox.node_failed",
        request=request,
        metadata={"node": node, "evicted_pods": len(outcome.get("evicted_pods", []))},
    )
    return outcome


def chaos_node_recover(*, node: str, request: HttpRequest) -> dict:
    outcome = _carry_out(_controls().recover_node, node)
    audit_record(action="sandbox.node_recovered", request=request, metadata={"node": node})
    return outcome


def chaos_xid_error(*, node: str, code: int, request: HttpRequest) -> dict:
    outcome = _carry_out(_controls().xid_error, node, code)
    audit_record(action="sandbox.xid_error", request=request, metadata={"node": node, "xid": code})
    return outcome


def chaos_stuck_gpus(*, node: str, request: HttpRequest) -> dict:
    outcome = _carry_out(_controls().stuck_gpus, node)
    audit_record(action="sandbox.stuck_gpus", request=request, metadata={"node": node})
    return outcome


def chaos_api_faults(
    *, mode: str, fraction: float, seconds: float, delay: float, request: HttpRequest
) -> dict:
    if mode not in API_FAULT_MODES:
        raise ServiceError("mode must be 'error' (HTTP 500) or 'slow'.", field="mode")
    outcome = _carry_out(
        _controls().api_faults, mode=mode, fraction=fraction, seconds=seconds, delay=delay
    )
    audit_record(
        action="sandbox.api_faults",
        request=request,
        metadata={"mode": mode, "fraction": fraction, "seconds": seconds, "delay": delay},
    )
    return outcome


def chaos_api_faults_clear(*, request: HttpRequest) -> dict:
    outcome = _carry_out(_controls().clear_api_faults)
    audit_record(action="sandbox.api_faults_cleared", request=request)
    return outcome
