"""A small JobSet controller (jobset.x-k8s.io/v1alpha2): one Job per replica of each
replicated Job, ``suspend`` passed down, Failed or Completed from its Jobs."""

from __future__ import annotations

import copy

from sandbox.kubesim.conditions import is_finished, is_true, set_condition
from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.resources import ResourceType
from sandbox.kubesim.store import Store


class JobSetController(Store):
    """One pass over every JobSet: create its Jobs, pass suspend down, sum up."""

    def install_jobset(self) -> None:
        """Serve JobSet (jobset.x-k8s.io/v1alpha2) with its controller's essentials: one
        Job `<jobset>-<replicatedJob>-<index>` per replica from the template (labels
        kept, owned by the JobSet), `suspend` passed down (and the pod template's
        metadata copied again on resume), Failed when a Job fails, Completed when all
        complete."""
        self.register_resource(
            ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", True)
        )

    def _jobset_pass(self) -> None:
        js_rt = self._by_key.get("jobsets.jobset.x-k8s.io")
        if js_rt is None:
            return
        jobs_rt = self._by_key["jobs.batch"]
        for jobset in self._objects(js_rt):
            meta, spec = jobset["metadata"], jobset.get("spec") or {}
            if meta.get("deletionTimestamp"):
                continue
            ns, suspend, done = meta["namespace"], bool(spec.get("suspend")), is_finished(jobset)
            children: list[dict] = []
            for rj in spec.get("replicatedJobs") or []:
                template = rj.get("template") or {}
                pod_meta = ((template.get("spec") or {}).get("template") or {}).get(
                    "metadata"
                ) or {}
                for index in range(int(rj.get("replicas", 1))):
                    name = f"{meta['name']}-{rj['name']}-{index}"
                    child = self._get(jobs_rt, ns, name)
                    if child is None and not done:
                        labels = dict((template.get("metadata") or {}).get("labels") or {})
                        labels["jobset.sigs.k8s.io/jobset-name"] = meta["name"]
                        labels["jobset.sigs.k8s.io/replicatedjob-name"] = rj["name"]
                        body = {
                            "metadata": {
                                "name": name,
                                "labels": labels,
                                "ownerReferences": [
                                    {
                                        "apiVersion": js_rt.api_version,
                                        "kind": "JobSet",
                                        "name": meta["name"],
                                        "uid": meta["uid"],
                                        "controller": True,
                                        "blockOwnerDeletion": True,
                                    }
                                ],
                            },
                            "spec": {
                                **copy.deepcopy(template.get("spec") or {}),
                                "suspend": suspend,
                            },
                        }
                        try:
                            child = self._create(jobs_rt, ns, body)
                        except ApiError:
                            continue  # e.g. over a ResourceQuota: tried again next pass
                    elif (
                        child is not None
                        and not done
                        and bool(child["spec"].get("suspend")) != suspend
                    ):

                        def flip(
                            job: dict, suspend: bool = suspend, pod_meta: dict = pod_meta
                        ) -> None:
                            job["spec"]["suspend"] = suspend
                            if not suspend:  # resumed: the template's pod metadata again
                                job["spec"]["template"].setdefault("metadata", {})[
                                    "annotations"
                                ] = copy.deepcopy(pod_meta.get("annotations") or {})

                        child = self._modify(jobs_rt, child, flip)
                    if child is not None:
                        children.append(child)
            if done or not children:
                continue
            ts = self._ts()
            expected = sum(int(rj.get("replicas", 1)) for rj in spec.get("replicatedJobs") or [])
            if any(is_true(c, "Failed") for c in children):
                self._modify(
                    js_rt,
                    jobset,
                    lambda o, ts=ts: set_condition(
                        o.setdefault("status", {}).setdefault("conditions", []),
                        "Failed",
                        "True",
                        "FailedJobs",
                        "a Job failed",
                        ts,
                    ),
                )
            elif len(children) == expected and all(is_true(c, "Complete") for c in children):
                self._modify(
                    js_rt,
                    jobset,
                    lambda o, ts=ts: set_condition(
                        o.setdefault("status", {}).setdefault("conditions", []),
                        "Completed",
                        "True",
                        "AllJobsCompleted",
                        "jobset completed",
                        ts,
                    ),
                )
