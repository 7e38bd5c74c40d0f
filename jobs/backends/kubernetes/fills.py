"""Filling a volume on a cluster: a copy Job per fill run in the tenant's namespace,
mounting the volume's claim (created here if no job made it yet), with the source's
credential in a Secret of its own. Where the run stands is read from the Job and from
its pod's log, whose last JSON line is the copy's report (storage.fill_pod)."""

from __future__ import annotations

import json
from typing import Any

from jobs.backends.base import FillRun
from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.client import ApiCalls, true_condition
from jobs.extensions import VolumeMount


def last_report(log_lines: list[str]) -> dict:
    """The newest report in a copy pod's log lines ({} when there is none yet): the JSON
    objects `python -m storage.fill_pod` writes, one per line. Only their numbers and
    message are read, as the copy's own account."""
    for line in reversed(log_lines):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict):
            return report
    return {}


# Log lines read from the end of the copy pod's log: its newest report is among them.
REPORT_TAIL_LINES = 20


class VolumeFillsMixin(ApiCalls):
    def volume_fill_start(
        self,
        *,
        tenant_id: int,
        mount: VolumeMount,
        fill_id: int,
        attempt: int,
        source: str,
        endpoint: str,
        credential: str,
    ) -> bool:
        namespace = self.ensure_namespace(tenant_id)  # type: ignore[attr-defined]
        claim = manifests.volume_claim_manifest(tenant_id, mount)
        self._create(
            f"volume claim {claim['metadata']['name']}",
            self.core.create_namespaced_persistent_volume_claim,
            namespace,
            claim,
        )
        name = manifests.volume_fill_name(fill_id, attempt)
        if credential:
            secret = manifests.volume_fill_secret_manifest(
                tenant_id=tenant_id,
                volume_id=mount.volume_id,
                fill_id=fill_id,
                attempt=attempt,
                credential=credential,
            )
            self._create(f"secret {name}", self.core.create_namespaced_secret, namespace, secret)
        job = manifests.volume_fill_job_manifest(
            tenant_id=tenant_id,
            mount=mount,
            fill_id=fill_id,
            attempt=attempt,
            source=source,
            endpoint=endpoint,
            with_credential=bool(credential),
        )
        self._create(f"Job {name}", self.batch.create_namespaced_job, namespace, job)
        return True

    def volume_fill_status(self, *, tenant_id: int, fill_id: int, attempt: int) -> FillRun:
        namespace = manifests.namespace_name(tenant_id)
        name = manifests.volume_fill_name(fill_id, attempt)
        job = self._call(
            f"reading Job {name}", self.batch.read_namespaced_job, name, namespace, ok=(404,)
        )
        if job is None:
            return FillRun(phase="gone", report={}, reason="Its copy Job was deleted.")
        report = self._fill_report(namespace, fill_id, attempt)
        failed = true_condition(job, "Failed")
        if true_condition(job, "Complete"):
            return FillRun(phase="succeeded", report=report)
        if failed is not None:
            reason = failed.message or failed.reason or "The copy pod failed."
            return FillRun(phase="failed", report=report, reason=reason)
        return FillRun(phase="running", report=report)

    def _fill_report(self, namespace: str, fill_id: int, attempt: int) -> dict:
        pods = self._call(
            f"listing the pods of fill {fill_id}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=manifests.managed_selector(
                **{manifests.FILL_LABEL: str(fill_id), manifests.ATTEMPT_LABEL: str(attempt)}
            ),
        )
        newest: Any = None
        for pod in pods.items if pods is not None else []:
            if newest is None or str(pod.metadata.creation_timestamp) > str(
                newest.metadata.creation_timestamp
            ):
                newest = pod
        if newest is None or not newest.status or newest.status.phase == "Pending":
            return {}
        text = self._call(
            f"reading the log of {newest.metadata.name}",
            self.core.read_namespaced_pod_log,
            newest.metadata.name,
            namespace,
            tail_lines=REPORT_TAIL_LINES,
            ok=(400, 404),
        )
        return last_report((text or "").splitlines())

    def volume_fill_stop(self, *, tenant_id: int, fill_id: int, attempt: int) -> None:
        namespace = manifests.namespace_name(tenant_id)
        name = manifests.volume_fill_name(fill_id, attempt)
        # Background propagation: batch/v1's default would orphan (and keep) the pod.
        self._delete(
            f"Job {name}", self.batch.delete_namespaced_job, name, namespace,
            propagation_policy="Background",
        )  # fmt: skip
        self._delete(f"secret {name}", self.core.delete_namespaced_secret, name, namespace)
