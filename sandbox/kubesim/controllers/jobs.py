"""The Job controller (batch/v1): creates a Job's pods up to its parallelism (with
completion indexes for Indexed Jobs), counts succeeded and failed pods, applies the pod
failure policy, backoffLimit, activeDeadlineSeconds, suspend/resume and
ttlSecondsAfterFinished, and keeps the Job's status and conditions."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from sandbox.kubesim.conditions import TERMINAL_PHASES, get_condition, set_condition
from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.resources import ResourceType
from sandbox.kubesim.store import Store

JOB_INDEX_KEY = "batch.kubernetes.io/job-completion-index"


@dataclass
class JobBook:
    counted: set = field(default_factory=set)  # uids of terminal pods already counted
    active: set = field(default_factory=set)  # uids of pods seen active
    ctrl_deleted: set = field(default_factory=set)  # uids the controller deleted itself
    ok_idx: set = field(default_factory=set)
    succeeded: int = 0
    failed: int = 0
    fail_reason: tuple[str, str] | None = None
    last_create_error: str | None = None


def _compress_indexes(idx: set[int]) -> str:
    out, run = [], []
    for i in sorted(idx):
        if run and i == run[-1] + 1:
            run.append(i)
        else:
            if run:
                out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


class JobsController(Store):
    """One pass over every Job: reconcile its pods and its status."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._books: dict[str, JobBook] = {}  # by Job uid

    def _forget(self, rt: ResourceType, obj: dict) -> None:
        super()._forget(rt, obj)
        if rt.key == "jobs.batch":
            self._books.pop(obj["metadata"]["uid"], None)

    def _owned_pods(self, job: dict) -> list[dict]:
        uid = job["metadata"]["uid"]
        return [
            p
            for p in self._objects(self._by_key["pods"], job["metadata"]["namespace"])
            if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
        ]

    @staticmethod
    def _pod_failure_action(job: dict, pod: dict) -> tuple[str, str] | None:
        rules = ((job.get("spec") or {}).get("podFailurePolicy") or {}).get("rules") or []
        pname = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        conds = (pod.get("status") or {}).get("conditions") or []
        for i, rule in enumerate(rules):
            action = rule.get("action")
            oc = rule.get("onExitCodes")
            if oc:
                values = set(oc.get("values") or [])
                for s in statuses:
                    if oc.get("containerName") and s["name"] != oc["containerName"]:
                        continue
                    code = ((s.get("state") or {}).get("terminated") or {}).get("exitCode")
                    if code is None or code == 0:
                        continue
                    hit = code in values if oc.get("operator") == "In" else code not in values
                    if hit:
                        return action, (
                            f"Container {s['name']} for pod {pname} failed with exit code "
                            f"{code} matching {action} rule at index {i}"
                        )
            for pat in rule.get("onPodConditions") or []:
                for c in conds:
                    if c.get("type") == pat.get("type") and c.get("status") == pat.get(
                        "status", "True"
                    ):
                        return action, (
                            f"Pod {pname} has condition {c['type']} matching {action} rule "
                            f"at index {i}"
                        )
        return None

    def _jobs_pass(self) -> None:
        jrt, prt = self._by_key["jobs.batch"], self._by_key["pods"]
        now, ts = self._now(), self._ts()
        for job in self._objects(jrt):
            uid = job["metadata"]["uid"]
            ns = job["metadata"]["namespace"]
            spec, status = job.get("spec") or {}, job.get("status") or {}
            book = self._books.setdefault(uid, JobBook())
            pods = self._owned_pods(job)
            indexed = spec.get("completionMode") == "Indexed"
            conds = copy.deepcopy(status.get("conditions") or [])
            finished = any(
                c["type"] in ("Complete", "Failed") and c["status"] == "True" for c in conds
            )
            if finished:
                ttl = spec.get("ttlSecondsAfterFinished")
                done_at = self._parse_ts(status.get("completionTime")) or self._parse_ts(
                    next((c["lastTransitionTime"] for c in conds if c["type"] == "Failed"), None)
                )
                if ttl is not None and done_at is not None and now >= done_at + ttl:
                    self._delete(jrt, job, "Background")
                    continue
            present = {p["metadata"]["uid"] for p in pods}
            for p in pods:
                puid, phase = p["metadata"]["uid"], p["status"].get("phase")
                if phase not in TERMINAL_PHASES:
                    book.active.add(puid)
                    continue
                if puid in book.counted:
                    continue
                book.counted.add(puid)
                book.active.discard(puid)
                if phase == "Succeeded":
                    book.succeeded += 1
                    idx = (p["metadata"].get("labels") or {}).get(JOB_INDEX_KEY)
                    if indexed and idx is not None:
                        book.ok_idx.add(int(idx))
                    continue
                hit = self._pod_failure_action(job, p)
                if hit and hit[0] == "Ignore":
                    continue
                book.failed += 1
                if hit and hit[0] == "FailJob" and book.fail_reason is None and not finished:
                    book.fail_reason = ("PodFailurePolicy", hit[1])
            for puid in list(book.active):
                if puid not in present:
                    book.active.discard(puid)
                    if puid not in book.ctrl_deleted:
                        book.failed += 1
            active = [p for p in pods if p["status"].get("phase") not in TERMINAL_PHASES]

            def kill(pods_: list[dict], job: dict = job, book: JobBook = book) -> None:
                for p in pods_:
                    book.ctrl_deleted.add(p["metadata"]["uid"])
                    self._delete(prt, p)
                    self._emit(
                        jrt,
                        job,
                        "Normal",
                        "SuccessfulDelete",
                        f"Deleted pod: {p['metadata']['name']}",
                    )

            new_status = copy.deepcopy(status)
            if not finished:
                completions = spec.get("completions")
                backoff = spec.get("backoffLimit", 6)
                start = self._parse_ts(status.get("startTime"))
                if book.fail_reason is None and backoff is not None and book.failed > backoff:
                    book.fail_reason = (
                        "BackoffLimitExceeded",
                        "Job has reached the specified backoff limit",
                    )
                if (
                    book.fail_reason is None
                    and spec.get("activeDeadlineSeconds") is not None
                    and start is not None
                    and not spec.get("suspend")
                    and now >= start + spec["activeDeadlineSeconds"]
                ):
                    book.fail_reason = (
                        "DeadlineExceeded",
                        "Job was active longer than specified deadline",
                    )
                if indexed:
                    complete = completions is not None and len(book.ok_idx) >= completions
                elif completions is not None:
                    complete = book.succeeded >= completions
                else:
                    complete = book.succeeded > 0 and not active
                if book.fail_reason is not None:
                    kill(active)
                    active = []
                    reason, msg = book.fail_reason
                    set_condition(conds, "FailureTarget", "True", reason, msg, ts)
                    set_condition(conds, "Failed", "True", reason, msg, ts)
                    self._emit(jrt, job, "Warning", reason, msg)
                elif complete:
                    kill(active)
                    active = []
                    msg = "Reached expected number of succeeded pods"
                    set_condition(
                        conds, "SuccessCriteriaMet", "True", "CompletionsReached", msg, ts
                    )
                    set_condition(conds, "Complete", "True", "CompletionsReached", msg, ts)
                    new_status["completionTime"] = ts
                    self._emit(jrt, job, "Normal", "Completed", "Job completed")
                elif spec.get("suspend"):
                    if active:
                        kill(active)
                        active = []
                    was = get_condition(job, "Suspended")
                    if not was or was["status"] != "True":
                        set_condition(
                            conds, "Suspended", "True", "JobSuspended", "Job suspended", ts
                        )
                        self._emit(jrt, job, "Normal", "Suspended", "Job suspended")
                    new_status.pop("startTime", None)
                else:
                    was = get_condition(job, "Suspended")
                    if was and was["status"] == "True":
                        set_condition(conds, "Suspended", "False", "JobResumed", "Job resumed", ts)
                        self._emit(jrt, job, "Normal", "Resumed", "Job resumed")
                    new_status.setdefault("startTime", ts)
                    active = active + self._create_job_pods(job, book, active)
            new_status["conditions"] = conds
            if not conds:
                new_status.pop("conditions")
            for k, v in (
                ("active", len(active)),
                ("succeeded", book.succeeded),
                ("failed", book.failed),
            ):
                if v:
                    new_status[k] = v
                else:
                    new_status.pop(k, None)
            new_status["ready"] = sum(
                1 for p in active if (get_condition(p, "Ready") or {}).get("status") == "True"
            )
            if indexed and book.ok_idx:
                new_status["completedIndexes"] = _compress_indexes(book.ok_idx)
            new_status.setdefault("uncountedTerminatedPods", {})
            current = self._get(jrt, ns, job["metadata"]["name"])
            if current is not None and current["metadata"]["uid"] == uid:

                def set_status(j: dict, st: dict = new_status) -> None:
                    j["status"] = st

                self._modify(jrt, current, set_status)

    def _create_job_pods(self, job: dict, book: JobBook, active: list[dict]) -> list[dict]:
        spec = job["spec"]
        ns = job["metadata"]["namespace"]
        parallelism = spec.get("parallelism", 1) or 0
        completions = spec.get("completions")
        slots = parallelism - len(active)
        if spec.get("completionMode") == "Indexed":
            busy = {int((p["metadata"].get("labels") or {}).get(JOB_INDEX_KEY, -1)) for p in active}
            wanted: list[int | None] = [
                i for i in range(completions or 0) if i not in book.ok_idx and i not in busy
            ]
        else:
            left = (completions - book.succeeded) if completions is not None else parallelism
            wanted = [None] * max(0, min(parallelism, left) - len(active))
        created = []
        for index in wanted[: max(0, slots)]:
            pod = self._job_pod(job, index)
            try:
                obj = self._create(self._by_key["pods"], ns, pod)
            except ApiError as e:
                msg = f"Error creating: {e.message}"
                same = re.sub(r'^Error creating: pods "[^"]*"', "", msg)
                if same != book.last_create_error:
                    book.last_create_error = same
                    self._emit(self._by_key["jobs.batch"], job, "Warning", "FailedCreate", msg)
                break
            book.last_create_error = None
            book.active.add(obj["metadata"]["uid"])
            created.append(obj)
            self._emit(
                self._by_key["jobs.batch"],
                job,
                "Normal",
                "SuccessfulCreate",
                f"Created pod: {obj['metadata']['name']}",
                "job-controller",
            )
        return created

    def _job_pod(self, job: dict, index: int | None) -> dict:
        tmpl = copy.deepcopy(job["spec"].get("template") or {})
        tmeta = tmpl.get("metadata") or {}
        labels = dict(tmeta.get("labels") or {})
        annotations = dict(tmeta.get("annotations") or {})
        jname = job["metadata"]["name"]
        spec = tmpl.get("spec") or {}
        if index is not None:
            labels[JOB_INDEX_KEY] = str(index)
            annotations[JOB_INDEX_KEY] = str(index)
            spec.setdefault("hostname", f"{jname}-{index}")
            env = {
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{JOB_INDEX_KEY}']"}},
            }
            for c in (spec.get("containers") or []) + (spec.get("initContainers") or []):
                if not any(e.get("name") == env["name"] for e in c.get("env") or []):
                    c["env"] = [*(c.get("env") or []), copy.deepcopy(env)]
        meta = {
            "generateName": f"{jname}-{index}-" if index is not None else f"{jname}-",
            "labels": labels,
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": jname,
                    "uid": job["metadata"]["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        }
        if annotations:
            meta["annotations"] = annotations
        return {"metadata": meta, "spec": spec}
