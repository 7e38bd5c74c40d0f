"""What the cluster says of an attempt: phase and reason from its Jobs and pods."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from jobs.backends.base import (
    BackendUnavailable,
    Observation,
)
from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.client import (
    FATAL_PULL_HINTS,
    FATAL_WAITING_REASONS,
    PULL_WAITING_REASONS,
    TERMINATION_REASONS,
    ApiCalls,
    current_pods,
    job_finished,
    main_container_status,
    true_condition,
)

if TYPE_CHECKING:
    from jobs.models import Job

log = logging.getLogger(__name__)


class ObserveMixin(ApiCalls):
    # --- observation ----------------------------------------------------------------------------
    def _attempt_pods(self, job: Job) -> list[Any]:
        namespace = manifests.namespace_name(job.tenant_id)
        listed = self._call(
            f"listing the pods of job {job.pk}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=manifests.managed_selector(
                **{manifests.JOB_LABEL: str(job.pk), manifests.ATTEMPT_LABEL: str(job.attempt)}
            ),
            ok=(404,),
        )
        return listed.items if listed is not None else []

    def port_address(self, job: Job, port: int) -> tuple[str, int] | None:
        """Rank 0's pod IP while it runs, for a port the job declared: the console's
        gateways dial it there (the job's NetworkPolicy admits them on its ports). None
        while it doesn't run, or when the cluster can't be read now."""
        if not any(declared.get("port") == port for declared in job.ports or []):
            return None
        try:
            pod = current_pods(self._attempt_pods(job)).get(0)
        except BackendUnavailable as error:
            log.warning("where job %s listens: %s", job.pk, error)
            return None
        status = pod.status if pod is not None else None
        if status is None or status.phase != "Running" or not status.pod_ip:
            return None
        if pod.metadata.deletion_timestamp:
            return None
        return status.pod_ip, port

    def observe(self, job: Job) -> Observation:
        """The attempt's state, from its tier Jobs and their pods.

        A cancelled job is running until its pods are gone (`_stopping`). Otherwise,
        precedence: a failed tier decides (preempted when a pod carries a DisruptionTarget
        condition, else failed with the deadline or the container's exit); then all tiers
        Complete → succeeded; Jobs gone → missing; suspended with no pods left →
        suspended; every rank Running (or done) → running; otherwise pending with the
        reason (unschedulable, quota, image pull). When one tier has failed, the tiers
        still running are deleted: a rank lost ends the whole attempt, as
        podFailurePolicy does within one Job.
        """
        if job.status == "cancelling":
            return self._stopping(job)
        namespace = manifests.namespace_name(job.tenant_id)
        found = self._attempt_jobs(job)
        kube_jobs = {tier: found.get(tier) for tier, _, _ in manifests.tiers(job)}
        present = {tier: kube_job for tier, kube_job in kube_jobs.items() if kube_job is not None}
        pods = self._attempt_pods(job) if present else []

        failed = [
            (tier, kube_job, true_condition(kube_job, "Failed"))
            for tier, kube_job in present.items()
            if true_condition(kube_job, "Failed")
        ]
        if failed:
            for kube_job in present.values():
                if not job_finished(kube_job):
                    self._delete_job(namespace, kube_job.metadata.name)
            return self._failure(job, failed, pods)
        if len(present) < len(kube_jobs) and self._jobset_exists(job):
            return Observation(phase="pending", reason="the JobSet is creating its Jobs")
        if not present:
            return Observation(phase="missing", reason="the attempt's Kubernetes Jobs are gone")
        if len(present) < len(kube_jobs):
            gone = sorted(t.replace("_", "-") for t in kube_jobs if t not in present)
            return Observation(
                phase="missing", reason=f"the {', '.join(gone)} Kubernetes Job is gone"
            )
        if all(true_condition(kube_job, "Complete") for kube_job in present.values()):
            return Observation(phase="succeeded", exit_code=0)

        live = [p for p in pods if p.status and p.status.phase in ("Pending", "Running", None)]
        suspended = [kube_job for kube_job in present.values() if kube_job.spec.suspend]
        if suspended and job.status != "pausing" and self._kueue_managed(suspended):
            # Created (or resumed) suspended: Kueue hasn't admitted it yet.
            return Observation(phase="pending", reason=self._kueue_wait_reason(job, suspended))
        if suspended:
            # The Job controller's Suspended condition, not only `spec.suspend`: it clears
            # `status.startTime` in the same write, and until then a resume may not
            # change the pod template (GPUGEEK_RESUMED would be refused).
            if not live and all(
                kube_job.spec.suspend and true_condition(kube_job, "Suspended")
                for kube_job in present.values()
            ):
                return Observation(phase="suspended")
            return Observation(phase="pending", reason="stopping")

        ranks = current_pods(pods)
        running = sum(1 for p in ranks.values() if p.status.phase == "Running")
        done = sum(1 for p in ranks.values() if p.status.phase == "Succeeded")
        if running and running + done >= job.nodes:
            return Observation(phase="running")
        return self._pending(job, ranks, present, running)

    def _stopping(self, job: Job) -> Observation:
        """A cancelled attempt: its Jobs are deleted (or about to be), but its pods hold
        their nodes until they are gone (SIGTERM, then the grace period): until then it
        is still running."""
        live = [
            pod
            for pod in self._attempt_pods(job)
            if pod.status is None or pod.status.phase in ("Pending", "Running", None)
        ]
        if live:
            return Observation(phase="running", reason=f"stopping: {len(live)} pod(s) left")
        return Observation(phase="cancelled")

    def _failure(
        self, job: Job, failed: list[tuple[str, Any, Any]], pods: list[Any]
    ) -> Observation:
        ranks = current_pods(pods)
        for _, _, condition in failed:
            if condition.reason != "PodFailurePolicy":
                continue
            for rank, pod in ranks.items():
                disruption = true_condition(pod, "DisruptionTarget")
                if disruption is not None:
                    detail = (
                        f"{disruption.reason}: {disruption.message}"
                        if disruption.message
                        else disruption.reason
                    )
                    return Observation(
                        phase="preempted", reason=f"rank {rank} disrupted ({detail})"[:500]
                    )
        _, _, condition = failed[0]
        if condition.reason == "DeadlineExceeded":
            return Observation(
                phase="failed",
                reason=f"exceeded the maximum runtime of {job.max_runtime_minutes} minutes",
            )
        for rank, pod in ranks.items():
            if pod.status.phase != "Failed":
                continue
            status = main_container_status(pod)
            terminated = status.state.terminated if status and status.state else None
            if terminated is not None:
                code = terminated.exit_code
                why = TERMINATION_REASONS.get(terminated.reason or "")
                text = f"{why}, exit code {code}" if why else f"exit code {code}"
                if terminated.message:
                    text += f": {terminated.message.strip()}"
                return Observation(
                    phase="failed", reason=f"rank {rank}: {text}"[:500], exit_code=code
                )
            waiting = status.state.waiting if status and status.state else None
            if waiting is not None:
                return Observation(
                    phase="failed",
                    reason=f"rank {rank}: {waiting.reason}: {waiting.message or ''}"[:500],
                )
        return Observation(phase="failed", reason=f"{condition.reason}: {condition.message}"[:500])

    def _pending(
        self, job: Job, ranks: dict[int, Any], present: dict[str, Any], running: int
    ) -> Observation:
        for rank, pod in ranks.items():
            status = main_container_status(pod)
            waiting = status.state.waiting if status and status.state else None
            if waiting is None:
                continue
            message = f"rank {rank}: {waiting.reason}: {waiting.message or ''}".strip()
            fatal = waiting.reason in FATAL_WAITING_REASONS or (
                waiting.reason in PULL_WAITING_REASONS
                and any(hint in (waiting.message or "").lower() for hint in FATAL_PULL_HINTS)
            )
            if fatal:
                return Observation(phase="failed", reason=f"image can't be pulled: {message}"[:500])
            if waiting.reason in PULL_WAITING_REASONS:
                return Observation(phase="pending", reason=f"pulling the image: {message}"[:500])
        for rank, pod in ranks.items():
            scheduled = next(
                (c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None
            )
            if scheduled is not None and scheduled.status == "False":
                return Observation(
                    phase="pending", reason=f"rank {rank} unschedulable: {scheduled.message}"[:500]
                )
        if len(ranks) < job.nodes:
            namespace = manifests.namespace_name(job.tenant_id)
            for kube_job in present.values():
                events = self._call(
                    "listing Job events",
                    self.core.list_namespaced_event,
                    namespace,
                    field_selector=(
                        f"involvedObject.name={kube_job.metadata.name},reason=FailedCreate"
                    ),
                    ok=(404,),
                )
                for event in (events.items if events else [])[-1:]:
                    return Observation(
                        phase="pending", reason=f"can't create pods: {event.message}"[:500]
                    )
        if running:
            return Observation(phase="pending", reason=f"{running} of {job.nodes} nodes running")
        return Observation(phase="pending", reason="waiting for pods")
