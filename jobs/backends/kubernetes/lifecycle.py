"""Submit, suspend, resume, cancel and release one job's attempt (idempotent writes)."""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from django.conf import settings

from console.crypto import decrypt_json
from jobs.backends.base import (
    BackendRejected,
)
from jobs.backends.kubernetes import manifests
from jobs.backends.kubernetes.client import (
    ApiCalls,
    job_finished,
    kueue_owner_uid,
)
from jobs.extensions import volume_provider
from marketplace.models import SuspectNode

if TYPE_CHECKING:
    from jobs.models import Job

log = logging.getLogger(__name__)


# One API call of an attempt's creation: what it creates (for messages), the client
# method and its arguments.
Create = tuple[str, Callable[..., Any], tuple]


# The process's threads for a batch's creates (they call only the API server), kept
# between batches: starting KUBERNETES_DISPATCH_CONCURRENCY threads for every batch cost
# a tenth of a batch's time. Made again after a fork (threads don't survive one).
_create_pool: tuple[int, int, ThreadPoolExecutor] | None = None
_create_pool_lock = threading.Lock()


def create_pool() -> ThreadPoolExecutor:
    global _create_pool
    size = max(1, settings.KUBERNETES_DISPATCH_CONCURRENCY)
    with _create_pool_lock:
        if _create_pool is None or _create_pool[:2] != (os.getpid(), size):
            if _create_pool is not None and _create_pool[0] == os.getpid():
                _create_pool[2].shutdown(wait=False)  # resized: its running calls finish
            pool = ThreadPoolExecutor(size, thread_name_prefix="kube-create")
            _create_pool = (os.getpid(), size, pool)
        return _create_pool[2]


class LifecycleMixin(ApiCalls):
    def _create_attempt(self, job: Job, *, resumed: bool) -> None:
        self._run_creates(self._attempt_creates(job, resumed=resumed))

    def _attempt_creates(
        self,
        job: Job,
        *,
        resumed: bool,
        namespace: str | None = None,
        pull_secrets: list[str] | None = None,
        volumes: list | None = None,
        suspect: dict[int, list[str]] | None = None,
    ) -> list[Create]:
        """Set up what the attempt needs first (its namespace, image pull Secret: these
        read the database) and return the creates of its own objects, in order: env
        Secret, Service, then its Job(s) or JobSet. They call only the API server, so a
        batch can run them in other threads. A volume's claim is created with the first job
        that mounts it and kept (409: it exists) until the volume is deleted."""
        namespace = namespace or self.ensure_namespace(job.tenant_id)
        creates: list[Create] = []
        if volumes is None:
            volumes = volume_provider().mounts_for(job)
        for mount in volumes:
            claim = manifests.volume_claim_manifest(job.tenant_id, mount)
            creates.append(
                (
                    f"volume claim {claim['metadata']['name']}",
                    self.core.create_namespaced_persistent_volume_claim,
                    (namespace, claim),
                )
            )
        store_credentials = manifests.checkpoint_secret_values(job)
        if job.secret_env_names or store_credentials:
            values = {**(decrypt_json(job.secret_env_encrypted) or {}), **store_credentials}
            secret = manifests.secret_manifest(job, values)
            creates.append(
                (
                    f"secret {secret['metadata']['name']}",
                    self.core.create_namespaced_secret,
                    (namespace, secret),
                )
            )
        if manifests.needs_service(job):
            service = manifests.service_manifest(job)
            creates.append(
                (
                    f"service {service['metadata']['name']}",
                    self.core.create_namespaced_service,
                    (namespace, service),
                )
            )
        if job.ports:
            policy = manifests.ports_policy_manifest(job)
            creates.append(
                (
                    f"network policy {policy['metadata']['name']}",
                    self.networking.create_namespaced_network_policy,
                    (namespace, policy),
                )
            )
        if pull_secrets is None:
            pull_secrets = self.ensure_pull_secret(job, namespace)
        avoid = _avoided(job, suspect_nodes_by_pool() if suspect is None else suspect)
        queue = self.kueue_queue()
        if self._gang(job, queue):
            jobset = manifests.jobset_manifest(
                job,
                kueue_queue=queue,
                resumed=resumed,
                pull_secrets=pull_secrets,
                volumes=volumes,
                avoid_nodes=avoid,
            )
            creates.append(
                (
                    f"JobSet {jobset['metadata']['name']}",
                    self.custom.create_namespaced_custom_object,
                    (
                        manifests.JOBSET_GROUP,
                        manifests.JOBSET_VERSION,
                        namespace,
                        "jobsets",
                        jobset,
                    ),
                )
            )
            return creates
        for manifest in manifests.job_manifests(
            job,
            resumed=resumed,
            pull_secrets=pull_secrets,
            kueue_queue=queue,
            volumes=volumes,
            avoid_nodes=avoid,
        ):
            creates.append(
                (
                    f"Job {manifest['metadata']['name']}",
                    self.batch.create_namespaced_job,
                    (namespace, manifest),
                )
            )
        return creates

    def _run_creates(self, creates: list[Create]) -> None:
        for what, create, args in creates:
            self._create(what, create, *args)

    def submit_many(self, jobs: list[Job]) -> dict[int, Exception | None]:
        """Start first attempts of many jobs: what reads the database (namespaces, once per
        tenant; pull Secrets, once per tenant and image) here, then each job's creates in up to
        KUBERNETES_DISPATCH_CONCURRENCY threads at once. Returns each job's error, or
        None where its objects exist now. A later attempt goes through `submit` (it
        removes the earlier attempts' Jobs first)."""
        outcomes: dict[int, Exception | None] = {}
        namespaces: dict[int, str] = {}
        pull_secrets: dict[tuple[int, str], list[str]] = {}  # per tenant and image
        prepared: list[tuple[Job, list[Create]]] = []
        mounts = volume_provider().mounts_for_jobs([job for job in jobs if job.attempt == 1])
        suspect = suspect_nodes_by_pool()
        for job in jobs:
            try:
                if job.attempt > 1:
                    self.submit(job)
                    outcomes[job.pk] = None
                    continue
                if job.tenant_id not in namespaces:
                    namespaces[job.tenant_id] = self.ensure_namespace(job.tenant_id)
                namespace = namespaces[job.tenant_id]
                image = (job.tenant_id, job.image_reference)
                if image not in pull_secrets:
                    pull_secrets[image] = self.ensure_pull_secret(job, namespace)
                creates = self._attempt_creates(
                    job,
                    resumed=False,
                    namespace=namespace,
                    pull_secrets=pull_secrets[image],
                    volumes=mounts[job.pk],
                    suspect=suspect,
                )
                prepared.append((job, creates))
            except Exception as error:
                outcomes[job.pk] = error
                self.forget_namespace(job.tenant_id)

        def run(creates: list[Create]) -> Exception | None:
            try:
                self._run_creates(creates)
            except Exception as error:
                return error
            return None

        results = create_pool().map(run, [creates for _, creates in prepared])
        for (job, _), error in zip(prepared, results, strict=True):
            outcomes[job.pk] = error
            if error is not None:
                self.forget_namespace(job.tenant_id)
        return outcomes

    def _jobs_of(self, job: Job) -> list[Any]:
        """Every Kubernetes Job of this job, all attempts and tiers."""
        namespace = manifests.namespace_name(job.tenant_id)
        listed = self._call(
            f"listing the Jobs of job {job.pk}",
            self.batch.list_namespaced_job,
            namespace,
            label_selector=manifests.managed_selector(**{manifests.JOB_LABEL: str(job.pk)}),
            ok=(404,),
        )
        return listed.items if listed is not None else []

    def volume_remove(self, *, tenant_id: int, volume_id: int) -> None:
        """Delete the volume's claim (its data goes with the claim's reclaim policy)."""
        name = manifests.volume_claim_name(volume_id)
        self._delete(
            f"volume claim {name}",
            self.core.delete_namespaced_persistent_volume_claim,
            name,
            manifests.namespace_name(tenant_id),
        )

    def volume_resize(self, *, tenant_id: int, volume_id: int, size_gib: int) -> None:
        """Ask for the larger size on the volume's claim (volume expansion; its storage
        class must allow it). A claim not made yet (404) gets the size when it is."""
        name = manifests.volume_claim_name(volume_id)
        self._call(
            f"resizing volume claim {name}",
            self.core.patch_namespaced_persistent_volume_claim,
            name,
            manifests.namespace_name(tenant_id),
            {"spec": {"resources": {"requests": {"storage": f"{int(size_gib)}Gi"}}}},
            ok=(404,),
        )

    def _delete_job(self, namespace: str, name: str) -> None:
        # Background propagation: batch/v1's default would orphan the pods.
        self._delete(
            f"Job {name}",
            self.batch.delete_namespaced_job,
            name,
            namespace,
            propagation_policy="Background",
        )

    def submit(self, job: Job) -> None:
        """Create the attempt's objects; earlier attempts' Jobs are removed first, so a
        requeued job never holds two attempts' compute."""
        namespace = manifests.namespace_name(job.tenant_id)
        if job.attempt > 1 and self._namespace_is_ours(job.tenant_id):
            if self.kueue_queue():  # a JobSet first, or it would make its Jobs again
                for attempt in range(1, job.attempt):
                    self._delete_jobset(namespace, f"gg-{job.pk}-a{attempt}")
            for kube_job in self._jobs_of(job):
                labels = kube_job.metadata.labels or {}
                if labels.get(manifests.ATTEMPT_LABEL) != str(job.attempt):
                    self._delete_job(namespace, kube_job.metadata.name)
        try:
            # A later attempt (after preemption or a lost node) continues the job's
            # work: GPUGEEK_RESUMED=1 tells the program to load its checkpoint.
            # So does a clone from a checkpoint (resume_from set on its first start).
            self._create_attempt(job, resumed=job.attempt > 1 or bool(job.resume_from))
        except Exception:
            self.forget_namespace(job.tenant_id)
            raise

    def _delete_jobset(self, namespace: str, name: str) -> None:
        self._delete(
            f"JobSet {name}",
            self.custom.delete_namespaced_custom_object,
            manifests.JOBSET_GROUP,
            manifests.JOBSET_VERSION,
            namespace,
            "jobsets",
            name,
            propagation_policy="Background",
        )

    def _attempt_jobs(self, job: Job) -> dict[str, Any]:
        """The current attempt's Kubernetes Jobs by tier, found by label: the same for
        our own Jobs and for those a JobSet made (which carry the template's labels)."""
        namespace = manifests.namespace_name(job.tenant_id)
        listed = self._call(
            f"listing the Jobs of job {job.pk}",
            self.batch.list_namespaced_job,
            namespace,
            label_selector=manifests.managed_selector(
                **{manifests.JOB_LABEL: str(job.pk), manifests.ATTEMPT_LABEL: str(job.attempt)}
            ),
            ok=(404,),
        )
        by_tier: dict[str, Any] = {}
        for kube_job in listed.items if listed is not None else []:
            tier = (kube_job.metadata.labels or {}).get(manifests.TIER_LABEL)
            if tier:
                by_tier[tier] = kube_job
        return by_tier

    def _jobset_exists(self, job: Job) -> bool:
        if not self.kueue_queue() or len(manifests.tiers(job)) < 2:
            return False
        return (
            self._call(
                f"reading JobSet {manifests.jobset_name(job)}",
                self.custom.get_namespaced_custom_object,
                manifests.JOBSET_GROUP,
                manifests.JOBSET_VERSION,
                manifests.namespace_name(job.tenant_id),
                "jobsets",
                manifests.jobset_name(job),
                ok=(404,),
            )
            is not None
        )

    def _patch_tiers(self, job: Job, body: dict) -> list[str]:
        """Patch each tier Job of the attempt; returns the names that were missing."""
        namespace = manifests.namespace_name(job.tenant_id)
        missing = []
        for tier, _, _ in manifests.tiers(job):
            name = manifests.job_name(job, tier)
            patched = self._call(
                f"updating Job {name}",
                self.batch.patch_namespaced_job,
                name,
                namespace,
                body,
                ok=(404,),
            )
            if patched is None:
                missing.append(name)
        return missing

    def suspend(self, job: Job) -> None:
        """`spec.suspend: true`: the Job controller deletes the pods (SIGTERM, then the
        grace period) and keeps the Job and its completed indexes. Under Kueue, which
        owns `suspend`, the Workload is deactivated instead: Kueue then suspends the Job
        (or JobSet) the same way and releases its quota."""
        kube_jobs = list(self._attempt_jobs(job).values())
        if self._kueue_managed(kube_jobs) and self._set_workloads_active(job, kube_jobs, False):
            return
        self._patch_tiers(job, {"spec": {"suspend": True}})

    def resume(self, job: Job) -> None:
        """Unsuspend the same Jobs and set the `gpugeek.io/resumed` pod annotation that
        GPUGEEK_RESUMED reads, in one patch.

        Why not delete and recreate (or `-r<n>` names)? A suspended Job that has not
        restarted accepts changes to its pod template's labels and annotations (the
        Job controller clears `status.startTime` on suspend), so one patch keeps the
        name, the rendezvous address and the completed indexes, and can't race a
        deletion still in progress. A Job that is gone (deleted by hand) is created
        again with GPUGEEK_RESUMED=1.
        """
        kube_jobs = self._attempt_jobs(job)
        if kube_jobs and self._kueue_managed(kube_jobs.values()):
            self._resume_under_kueue(job, kube_jobs)
            return
        body = {
            "spec": {
                "suspend": False,
                "template": {"metadata": {"annotations": manifests.resume_annotations(job)}},
            }
        }
        try:
            missing = self._patch_tiers(job, body)
        except BackendRejected as error:
            # The template was refused (an older cluster): resume without the flag;
            # the checkpoint itself still tells the program where to continue.
            log.warning("job %s: resuming without GPUGEEK_RESUMED=1 (%s)", job.pk, error)
            missing = self._patch_tiers(job, {"spec": {"suspend": False}})
        if missing:
            try:
                self._create_attempt(job, resumed=True)
            except Exception:
                self.forget_namespace(job.tenant_id)
                raise

    def _resume_under_kueue(self, job: Job, kube_jobs: dict[str, Any]) -> None:
        """Flag the pods as resumed (allowed while suspended), then reactivate the
        Workload so that Kueue admits the attempt again and unsuspends it."""
        namespace = manifests.namespace_name(job.tenant_id)
        flag = manifests.resume_annotations(job)
        if any(kueue_owner_uid(k) != k.metadata.uid for k in kube_jobs.values()):
            # A JobSet copies its template to its Jobs when it is unsuspended.
            ops = [
                {
                    "op": "replace",
                    "path": f"/spec/replicatedJobs/{index}/template/spec/template/metadata"
                    f"/annotations/{name.replace('/', '~1')}",
                    "value": value,
                }
                for index in range(len(manifests.tiers(job)))
                for name, value in flag.items()
            ]
            self._call(
                f"updating JobSet {manifests.jobset_name(job)}",
                self.custom.patch_namespaced_custom_object,
                manifests.JOBSET_GROUP,
                manifests.JOBSET_VERSION,
                namespace,
                "jobsets",
                manifests.jobset_name(job),
                ops,
                _content_type="application/json-patch+json",
            )
        else:
            self._patch_tiers(job, {"spec": {"template": {"metadata": {"annotations": flag}}}})
        if not self._set_workloads_active(job, list(kube_jobs.values()), True):
            self._patch_tiers(job, {"spec": {"suspend": False}})  # no Workload: not queued

    def cancel(self, job: Job) -> None:
        """Delete every Job of this job (any attempt) with its pods, its Service and its
        Secret; what is already gone is fine."""
        namespace = manifests.namespace_name(job.tenant_id)
        if not self._namespace_is_ours(job.tenant_id):
            return
        if self.kueue_queue():  # the JobSet first, or it would make its Jobs again
            self._delete_jobset(namespace, manifests.jobset_name(job))
        names = {kube_job.metadata.name for kube_job in self._jobs_of(job)}
        names |= {manifests.job_name(job, tier) for tier, _, _ in manifests.tiers(job)}
        for name in sorted(names):
            self._delete_job(namespace, name)
        self._release_in(namespace, job)

    def release(self, job: Job) -> None:
        """After a job has finished: delete what of it still runs, remove its rendezvous
        Service and its Secret. Its finished Jobs and their pods stay (for the logs) until
        ttlSecondsAfterFinished. Something still runs when a tier outlived the attempt
        (the other tier was lost) or a create the client gave up on landed after the job
        ended (a cancel meanwhile found nothing to delete)."""
        if not self._namespace_is_ours(job.tenant_id):
            return
        namespace = manifests.namespace_name(job.tenant_id)
        running = [j.metadata.name for j in self._jobs_of(job) if not job_finished(j)]
        if running and self.kueue_queue():  # the JobSet first, or it would make them again
            self._delete_jobset(namespace, manifests.jobset_name(job))
        for name in running:
            self._delete_job(namespace, name)
        self._release_in(namespace, job)

    def publish_file(self, job: Job, name: str, text: str) -> bool:
        """`name` into the job's ConfigMap, which its pods mount (optionally) at
        PUBLISHED_MOUNT: patched, or made with the first file. The running pods see it
        once the kubelet syncs the volume (within about a minute)."""
        if not self._namespace_is_ours(job.tenant_id):
            return False
        namespace = manifests.namespace_name(job.tenant_id)
        if self._patch_published(job, namespace, {name: text}):
            return True
        body = manifests.published_manifest(job, {name: text})
        what = f"config map {manifests.published_name(job)}"
        if self._create(what, self.core.create_namespaced_config_map, namespace, body):
            return True
        # Made by a publish beside this one since the patch: this file goes on top.
        return self._patch_published(job, namespace, {name: text})

    def _patch_published(self, job: Job, namespace: str, files: dict[str, str]) -> bool:
        """Patch the files into the job's ConfigMap; False when it doesn't exist."""
        patched = self._call(
            f"patching config map {manifests.published_name(job)}",
            self.core.patch_namespaced_config_map,
            manifests.published_name(job),
            namespace,
            {"data": files},
            ok=(404,),
            _preload_content=False,
        )
        if patched is None:
            return False
        patched.read()
        patched.release_conn()
        return True

    def _release_in(self, namespace: str, job: Job) -> None:
        self._delete(
            f"service {manifests.service_name(job)}",
            self.core.delete_namespaced_service,
            manifests.service_name(job),
            namespace,
        )
        if job.ports:
            self._delete(
                f"network policy {manifests.service_name(job)}",
                self.networking.delete_namespaced_network_policy,
                manifests.service_name(job),
                namespace,
            )
        self._delete(
            f"secret {manifests.secret_name(job)}",
            self.core.delete_namespaced_secret,
            manifests.secret_name(job),
            namespace,
        )
        self._delete(
            f"config map {manifests.published_name(job)}",
            self.core.delete_namespaced_config_map,
            manifests.published_name(job),
            namespace,
        )


def suspect_nodes_by_pool() -> dict[int, list[str]]:
    """The nodes marked suspect (their GPUs reported a hardware fault: jobs.repair), by
    pool, which pods there avoid even where the console may not cordon them. One read
    of a table that is nearly always empty, per dispatch batch."""
    by_pool: dict[int, list[str]] = defaultdict(list)
    for pool_id, name in SuspectNode.objects.filter(pool__isnull=False).values_list(
        "pool_id", "name"
    ):
        by_pool[pool_id].append(name)
    return by_pool


def _avoided(job: Job, suspect: dict[int, list[str]]) -> list[str]:
    return sorted(
        name
        for pool_id in (job.pool_id, job.spot_pool_id)
        if pool_id
        for name in suspect.get(pool_id, [])
    )
