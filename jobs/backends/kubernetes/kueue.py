"""Kueue: whether it admits our jobs, JobSet gangs, and pausing through Workloads."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.conf import settings
from kubernetes import client

from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.client import (
    API_GROUPS_CACHE,
    API_GROUPS_TTL,
    MERGE_PATCH,
    ApiCalls,
    kueue_owner_uid,
)

if TYPE_CHECKING:
    from jobs.models import Job

log = logging.getLogger(__name__)


class KueueMixin(ApiCalls):
    # --- Kueue ----------------------------------------------------------------------------
    def api_groups(self) -> frozenset[str]:
        """The API groups this cluster serves (discovery, cached for a few minutes)."""
        host = self.api_client.configuration.host
        cached = API_GROUPS_CACHE.get(host)
        if cached is not None and time.monotonic() - cached[0] < API_GROUPS_TTL:
            return cached[1]
        discovery = client.ApisApi(self.api_client)
        listed = self._call("discovering API groups", discovery.get_api_versions)
        groups = frozenset(group.name for group in listed.groups or [])
        API_GROUPS_CACHE[host] = (time.monotonic(), groups)
        return groups

    def kueue_queue(self) -> str | None:
        """The tenant LocalQueue's name when Kueue admits our jobs (KUEUE=on, or auto and
        the cluster serves kueue.x-k8s.io), else None: then our admission alone decides."""
        mode = settings.KUEUE
        if mode == "off" or (mode == "auto" and manifests.KUEUE_GROUP not in self.api_groups()):
            return None
        return settings.KUEUE_QUEUE_NAME

    def _gang(self, job: Job, queue: str | None) -> bool:
        """A split job goes to Kueue as one JobSet (manifests.jobset_manifest says why),
        where the cluster has JobSet; without it, as one Job per tier (each admitted on
        its own, so a warning)."""
        if not manifests.is_gang(job, queue):
            return False
        if manifests.JOBSET_GROUP in self.api_groups():
            return True
        log.warning("job %s: JobSet isn't installed; Kueue admits its tiers apart", job.pk)
        return False

    def _workloads(self, namespace: str, owner_uid: str) -> list[dict]:
        """Kueue's Workload(s) of a Job or JobSet (labelled with its uid)."""
        listed = self._call(
            "listing Kueue workloads",
            self.custom.list_namespaced_custom_object,
            manifests.KUEUE_GROUP,
            manifests.KUEUE_VERSION,
            namespace,
            "workloads",
            label_selector=f"kueue.x-k8s.io/job-uid={owner_uid}",
            ok=(404,),
        )
        return (listed or {}).get("items") or []

    def _set_workloads_active(self, job: Job, kube_jobs: list[Any], active: bool) -> bool:
        """Deactivate (pause) or reactivate (resume) the attempt's Workloads: the way to
        stop a Kueue-managed job, since Kueue owns `suspend`. Returns False when Kueue
        hasn't made a Workload yet."""
        namespace = manifests.namespace_name(job.tenant_id)
        found = False
        for owner_uid in sorted({kueue_owner_uid(kube_job) for kube_job in kube_jobs}):
            for workload in self._workloads(namespace, owner_uid):
                found = True
                self._call(
                    f"updating Kueue workload {workload['metadata']['name']}",
                    self.custom.patch_namespaced_custom_object,
                    manifests.KUEUE_GROUP,
                    manifests.KUEUE_VERSION,
                    namespace,
                    "workloads",
                    workload["metadata"]["name"],
                    {"spec": {"active": active}},
                    _content_type=MERGE_PATCH,
                    ok=(404,),
                )
        return found

    def _kueue_wait_reason(self, job: Job, kube_jobs: list[Any]) -> str:
        """Why Kueue hasn't admitted the attempt yet, from its Workload's conditions."""
        namespace = manifests.namespace_name(job.tenant_id)
        for owner_uid in sorted({kueue_owner_uid(kube_job) for kube_job in kube_jobs}):
            for workload in self._workloads(namespace, owner_uid):
                for condition in (workload.get("status") or {}).get("conditions") or []:
                    if condition.get("type") == "QuotaReserved" and condition.get("message"):
                        return f"waiting for Kueue admission: {condition['message']}"[:500]
        return "waiting for Kueue admission"

    @staticmethod
    def _kueue_managed(kube_jobs: Iterable[Any]) -> bool:
        return any(
            manifests.KUEUE_QUEUE_LABEL in (kube_job.metadata.labels or {})
            or kueue_owner_uid(kube_job) != kube_job.metadata.uid
            for kube_job in kube_jobs
        )
