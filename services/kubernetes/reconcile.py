"""One reconcile pass of a service on a Kubernetes cluster (called by
services.reconcile.service_reconcile with the service locked).

The Deployment owns the pods; the pass mirrors them as `ServiceReplica` rows (handle:
the pod's name, host: its IP), so the gateway, metering, the page and the API read
replicas the same way wherever they run:

- a new pod is a new row (starting); Ready makes it ready; a pod that ends or is gone
  stops its row (billed up to now);
- the wanted count is the console's decision (rps/concurrency, from the gateway's
  counters, as on the host) or, with `autoscale: cpu`, the HorizontalPodAutoscaler's;
- a scale-down the console decides drains first: the gateway stops sending to the
  idlest pods, which are marked as the ReplicaSet's first to go (pod-deletion-cost);
  the Deployment's count goes down once they are idle, so no request in flight is cut;
- a new revision is the Deployment's rolling update (one pod more at most, none
  unavailable): old pods go only once new ones are ready.

A cluster that can't be reached leaves everything as it is (the reason on the page);
one that refuses the objects fails the service with the API's message, and a service
never deployed has what was created of it removed.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime

from django.conf import settings

from jobs.backends import BackendRejected, BackendUnavailable
from marketplace.models import Image
from marketplace.selectors import images_for_tenant
from services import scaling
from services.kubernetes import cluster
from services.kubernetes.manifests import uses_hpa
from services.models import (
    ReplicaState,
    ScaleWindow,
    Service,
    ServiceReplica,
    ServiceScaleEvent,
    ServiceStatus,
)

logger = logging.getLogger(__name__)

# pod-deletion-cost of a drained pod (the ReplicaSet removes the lowest first).
DRAINED_COST = -1000


def catalog_image(service: Service) -> Image | None:
    """The catalog image a service on a cluster runs (its `image` is the slug)."""
    return images_for_tenant(tenant=service.tenant).filter(slug=service.image).first()


def _mirror(
    service: Service, pods: list[cluster.PodSeen], rows: list[ServiceReplica], now: datetime
) -> list[ServiceReplica]:
    """Rows made to match the pods; the live ones."""
    by_handle = {row.handle: row for row in rows}
    revisions = dict(service.revisions.values_list("number", "pk"))
    ports = dict(service.revisions.values_list("number", "port"))
    live = []
    for pod in pods:
        row = by_handle.pop(pod.name, None)
        pod = dataclasses.replace(pod, port=ports.get(pod.revision, 0))
        if pod.ended or pod.revision not in revisions:
            if row is not None:
                by_handle[pod.name] = row  # stopped below
            continue
        if row is None:
            row = ServiceReplica.objects.create(
                service=service,
                revision_id=revisions[pod.revision],
                handle=pod.name,
                host=pod.ip,
                host_port=ports[pod.revision],
                started_at=now,
            )
        state = row.state
        if state != ReplicaState.DRAINING:
            state = ReplicaState.READY if _serves(service, pod) else ReplicaState.STARTING
        if (state, pod.ip) != (row.state, row.host):
            if state == ReplicaState.READY and row.ready_at is None:
                row.ready_at = now
            row.state, row.host = state, pod.ip
            row.save(update_fields=["state", "host", "ready_at"])
        live.append(row)
    for row in by_handle.values():  # its pod ended or is gone
        row.state, row.stopped_at = ReplicaState.STOPPED, now
        row.reason = row.reason or "its pod is gone"
        row.save(update_fields=["state", "reason", "stopped_at"])
    return live


def _serves(service: Service, pod: cluster.PodSeen) -> bool:
    """Ready for the kubelet, or already answering the readiness path when the console
    asks (the kubelet probes once a second at most: a request held at zero goes as soon
    as the server answers, as Knative's activator does)."""
    if not pod.ip:
        return False
    return pod.ready or scaling.answers_ready(
        host=pod.ip, port=pod.port, path=service.readiness_path
    )


def _hpa_count(service: Service, seen: cluster.DeploymentSeen | None, now: datetime) -> int:
    """The HorizontalPodAutoscaler's count (the minimum until it has one); a change is a
    scale event like the console's own."""
    desired = max(1, service.min_replicas)
    if seen is not None and seen.autoscaler != "console":
        desired = seen.replicas or desired
    desired = min(max(desired, service.min_replicas), service.max_replicas)
    if desired != service.desired_replicas:
        ServiceScaleEvent.objects.create(
            service=service, at=now, from_replicas=service.desired_replicas,
            to_replicas=desired, window=ScaleWindow.HPA, metric=service.autoscale_metric,
            target=service.autoscale_target, stable_value=0, panic_value=0,
        )  # fmt: skip
    service.desired_replicas, service.panic_until, service.scale_down_wanted_since = (
        desired,
        None,
        None,
    )
    return desired


def _cost(kube, service: Service, rows: list[ServiceReplica], cost: int) -> None:
    for row in rows:
        cluster.pod_deletion_cost(kube, service, row.handle, cost)


def service_pass(service: Service, now: datetime) -> None:
    """One pass over a service whose pool is on a cluster (see the module's docstring)."""
    revision = service.current_revision
    assert revision is not None  # every service has one from its creation
    kube = cluster.backend()
    try:
        pods = cluster.pods_list(kube, service)
        seen = cluster.deployment_read(kube, service)
    except (BackendUnavailable, BackendRejected) as error:
        service.status_reason = f"The cluster can't be reached: {error}"[:300]
        return
    rows = list(service.replicas.exclude(state=ReplicaState.STOPPED))
    ready_before = any(r.state == ReplicaState.READY for r in rows)
    live = _mirror(service, pods, rows, now)
    ready_now = [r for r in live if r.state == ReplicaState.READY]
    if ready_now and not ready_before:
        scaling.record_cold_start(service, ready_now[0])
    in_flight = scaling.in_flight(live)
    draining = [r for r in live if r.state == ReplicaState.DRAINING]
    serving = [r for r in live if r.state != ReplicaState.DRAINING]
    if service.paused_by_budget:
        desired = scaling.budget_paused(service, now)
    elif uses_hpa(service):
        desired = _hpa_count(service, seen, now)
    elif (decision := scaling.decide(service, ready=len(ready_now), now=now)) is not None:
        desired = decision.desired
    else:
        desired = min(max(service.desired_replicas, service.min_replicas), service.max_replicas)
    current = [r for r in serving if r.revision_id == revision.pk]
    try:
        if not uses_hpa(service):
            # Wanted again before its pod went: it serves again.
            back = [r for r in draining if r.revision_id == revision.pk]
            back = back[: max(0, desired - len(current))]
            _cost(kube, service, back, 0)
            for row in back:
                row.state, row.reason, row.draining_at = ReplicaState.STARTING, "", None
                row.save(update_fields=["state", "reason", "draining_at"])
                draining.remove(row)
                current.append(row)
            surplus = scaling.keep_first(current, in_flight)[desired:]
            why = "paused: its budget is used up" if service.paused_by_budget else "scaled down"
            _cost(kube, service, surplus, DRAINED_COST)
            scaling.drain(surplus, why, now)
            draining += surplus
        # A drained pod stays counted until it is idle; then the count drops and the
        # ReplicaSet removes it (the lowest deletion cost).
        still = [r for r in draining if scaling.drain_finished(r, in_flight, now) is None]
        image = catalog_image(service)
        cluster.objects_apply(
            kube,
            service,
            revision,
            seen=seen,
            image_reference=image.reference if image else service.image,
            replicas=desired + len(still),
            secret_values=lambda: scaling.secret_values(
                tenant=service.tenant, names=revision.secrets
            ),
            volumes=scaling.volume_mounts(service, revision),
        )
    except BackendUnavailable as error:
        service.status_reason = f"The cluster can't be reached: {error}"[:300]
        return
    except (BackendRejected, scaling.SecretGone, scaling.VolumeGone) as error:
        _refused(kube, service, seen, str(error))
        return
    restarts = sum(p.restarts for p in pods if p.revision == revision.number and not p.ended)
    waiting = sorted({p.waiting for p in pods if p.waiting and p.revision == revision.number})
    service.restarts = restarts
    ready = sum(r.state == ReplicaState.READY for r in current)
    service.status, service.status_reason = scaling.status_for(
        service, desired=desired, ready=ready, live=len(live)
    )
    if waiting and service.status != ServiceStatus.READY:
        service.status_reason = f"Its pods wait: {', '.join(waiting)}."[:300]


def _refused(kube, service: Service, seen: cluster.DeploymentSeen | None, why: str) -> None:
    """The cluster refused the service's objects: it fails with the API's message; a
    service never deployed keeps nothing half-created."""
    logger.warning("service %s refused by the cluster: %s", service.pk, why)
    service.status = ServiceStatus.FAILED
    service.status_reason = f"The cluster refused it: {why}"[:300]
    service.restarts = settings.SERVICE_MAX_RESTARTS
    if seen is None:
        try:
            cluster.objects_delete(kube, tenant_id=service.tenant_id, service_id=service.pk)
        except (BackendUnavailable, BackendRejected) as error:
            logger.warning("could not remove service %s's objects: %s", service.pk, error)


def service_objects_delete(*, tenant_id: int, service_id: int) -> None:
    """A deleted service's objects go (BackendUnavailable: try again later)."""
    cluster.objects_delete(cluster.backend(), tenant_id=tenant_id, service_id=service_id)
