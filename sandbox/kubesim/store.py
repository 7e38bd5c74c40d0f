"""The object store: typed buckets of JSON objects, one resourceVersion counter, the
watch history, and create/update/delete with the API server's semantics (generateName,
optimistic concurrency, the status subresource, owner-reference garbage collection).

Every other part of the simulator is a mixin on top of ``Store``; they share its one
re-entrant lock, and streams wait on its condition."""

from __future__ import annotations

import copy
import itertools
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.resources import ResourceType
from sandbox.kubesim.selectors import Predicate
from sandbox.kubesim.validation import invalid, validate_labels, validate_name, validate_ports

_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generateName


@dataclass
class WatchEvent:
    """One change in the watch history: the object after it, and before it for MODIFIED
    (a watch with selectors turns a change across its selection into ADDED/DELETED)."""

    rv: int
    type: str
    key: str
    obj: dict
    old: dict | None


class Store:
    """Objects by resource type and (namespace, name), and the primitives that change
    them; each change bumps the resourceVersion and is recorded for watches."""

    def __init__(self, *, watch_history: int = 1000) -> None:
        super().__init__()
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._stopping = threading.Event()  # set by stop(): streams and waits end
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._by_key: dict[str, ResourceType] = {}
        self._store: dict[str, dict[tuple[str, str], dict]] = {}
        self._rv = 0
        self._history: deque[WatchEvent] = deque(maxlen=watch_history)
        self._history_floor = 0
        self._rand = random.Random()
        self._ips = itertools.count(2)  # addresses of nodes, pods and services
        self._clock_offset = 0.0
        #: Tracebacks of bugs inside the simulator (the test fixture fails the test if any).
        self.errors: list[str] = []

    def _report_bug(self, tb: str) -> None:
        """Record the traceback of a bug inside the simulator (see ``errors``)."""
        self.errors.append(tb)

    def register_resource(
        self,
        rt_or_group: ResourceType | str,
        version: str = "v1",
        plural: str = "",
        kind: str = "",
        namespaced: bool = True,
        has_status: bool = True,
    ) -> ResourceType:
        """Add a resource type (e.g. a CRD such as Kueue's ``workloads``)."""
        if isinstance(rt_or_group, ResourceType):
            rt = rt_or_group
        else:
            rt = ResourceType(rt_or_group, version, plural, kind, namespaced, has_status)
        with self._lock:
            self._types[(rt.group, rt.version, rt.plural)] = rt
            self._by_key[rt.key] = rt
            self._store.setdefault(rt.key, {})
        return rt

    def _rt(self, resource: str | ResourceType) -> ResourceType:
        if isinstance(resource, ResourceType):
            return resource
        if resource in self._by_key:
            return self._by_key[resource]
        matches = [
            rt
            for rt in self._by_key.values()
            if resource in (rt.plural, rt.kind) or resource.lower() == rt.kind.lower()
        ]
        if len(matches) == 1:
            return matches[0]
        raise KeyError(f"unknown or ambiguous resource {resource!r}")

    def _now(self) -> float:
        return time.time() + self._clock_offset

    def _ts(self, t: float | None = None) -> str:
        return datetime.fromtimestamp(self._now() if t is None else t, UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )

    @staticmethod
    def _parse_ts(s: str | None) -> float | None:
        if not s:
            return None
        return datetime.strptime(s[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=UTC).timestamp()

    @property
    def resource_version(self) -> int:
        return self._rv

    def _get(self, rt: ResourceType, ns: str | None, name: str) -> dict | None:
        return self._store[rt.key].get((ns or "", name))

    def _must_get(self, rt: ResourceType, ns: str | None, name: str) -> dict:
        obj = self._get(rt, ns, name)
        if obj is None:
            raise ApiError(404, f"{rt.what(name)} not found", details=rt.details(name))
        return obj

    def _record(self, rt: ResourceType, etype: str, obj: dict, old: dict | None) -> None:
        if self._history.maxlen and len(self._history) == self._history.maxlen:
            self._history_floor = self._history[0].rv
        self._history.append(WatchEvent(self._rv, etype, rt.key, copy.deepcopy(obj), old))
        self._cond.notify_all()

    def _insert(self, rt: ResourceType, obj: dict) -> dict:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        meta = obj["metadata"]
        self._store[rt.key][(meta.get("namespace") or "", meta["name"])] = obj
        self._record(rt, "ADDED", obj, None)
        return obj

    def _replace_obj(self, rt: ResourceType, new: dict, old: dict) -> dict:
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        meta = new["metadata"]
        self._store[rt.key][(meta.get("namespace") or "", meta["name"])] = new
        self._record(rt, "MODIFIED", new, old)
        return new

    def _remove(self, rt: ResourceType, obj: dict) -> dict | None:
        meta = obj["metadata"]
        key = (meta.get("namespace") or "", meta["name"])
        current = self._store[rt.key].get(key)
        if current is None or current["metadata"]["uid"] != meta["uid"]:
            return None
        del self._store[rt.key][key]
        self._rv += 1
        gone = copy.deepcopy(current)
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._record(rt, "DELETED", gone, None)
        self._forget(rt, current)
        return gone

    def _modify(self, rt: ResourceType, old: dict, fn: Callable[[dict], None]) -> dict:
        new = copy.deepcopy(old)
        fn(new)
        if new == old:
            return old
        return self._replace_obj(rt, new, old)

    def _objects(self, rt: ResourceType, ns: str | None = None) -> list[dict]:
        items = self._store[rt.key].items()
        return [o for k, o in sorted(items, key=lambda kv: kv[0]) if ns is None or k[0] == ns]

    @staticmethod
    def _matches(obj: dict, ns: str | None, lsel: list[Predicate], fsel: list[Predicate]) -> bool:
        meta = obj.get("metadata") or {}
        if ns is not None and (meta.get("namespace") or "") != ns:
            return False
        labels = meta.get("labels") or {}
        return all(p(labels) for p in lsel) and all(p(obj) for p in fsel)

    def _admit(self, rt: ResourceType, obj: dict) -> None:
        """Admission control before an object is stored (see admission.py)."""

    def _forget(self, rt: ResourceType, obj: dict) -> None:
        """Drop what a part of the simulator keeps beside a removed object (its logs, its
        run, its Job's bookkeeping); each part extends this and calls ``super()``."""

    def _create(
        self,
        rt: ResourceType,
        ns: str | None,
        obj: Any,
        *,
        dry_run: bool = False,
        keep_status: bool = False,
    ) -> dict:
        if not isinstance(obj, dict):
            raise ApiError(400, "the request body must be a JSON object")
        obj = copy.deepcopy(obj)
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            meta = obj["metadata"] = {}
        if obj.get("kind") and obj["kind"] != rt.kind:
            raise ApiError(400, f"the kind {obj['kind']!r} does not match {rt.kind!r}")
        if rt.namespaced:
            body_ns = meta.get("namespace")
            ns = ns or body_ns or "default"
            if body_ns and body_ns != ns:
                raise ApiError(
                    400,
                    "the namespace of the provided object does not match the namespace "
                    "sent on the request",
                )
            if self._get(self._by_key["namespaces"], None, ns) is None:
                raise ApiError(
                    404,
                    f'namespaces "{ns}" not found',
                    details={"name": ns, "kind": "namespaces"},
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        name = meta.get("name")
        if not name:
            if not meta.get("generateName"):
                raise invalid(rt, "", "metadata.name", "", "name or generateName is required")
            for _ in range(50):
                name = meta["generateName"] + "".join(self._rand.choices(_NAME_CHARS, k=5))
                if self._get(rt, ns, name) is None:
                    break
            meta["name"] = name
        validate_name(rt, name)
        if self._get(rt, ns, name) is not None:
            raise ApiError(
                409,
                f"{rt.what(name)} already exists",
                reason="AlreadyExists",
                details=rt.details(name),
            )
        obj["apiVersion"] = rt.api_version
        obj["kind"] = rt.kind
        for k in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(k, None)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = self._ts()
        meta["generation"] = 1
        if rt.has_status and not keep_status:
            obj["status"] = {}
        validate_labels(rt, name, meta.get("labels"))
        hook = getattr(self, f"_prepare_{rt.kind.lower()}", None)
        if hook:
            hook(rt, obj, None)
        validate_labels(rt, name, meta.get("labels"))
        validate_ports(rt, name, obj)
        self._admit(rt, obj)
        if dry_run:
            return obj
        return self._insert(rt, obj)

    def _update(
        self,
        rt: ResourceType,
        old: dict,
        cand: Any,
        *,
        sub: str | None = None,
        dry_run: bool = False,
    ) -> dict:
        if not isinstance(cand, dict):
            raise ApiError(400, "the request body must be a JSON object")
        ometa = old["metadata"]
        cmeta = cand.get("metadata") if isinstance(cand.get("metadata"), dict) else {}
        name = ometa["name"]
        if cmeta.get("name") not in (None, name):
            raise ApiError(
                400,
                f"the name of the object ({cmeta.get('name')}) does not match the name on "
                f"the URL ({name})",
            )
        if cmeta.get("resourceVersion") not in (None, "", ometa["resourceVersion"]):
            raise ApiError(
                409,
                f"Operation cannot be fulfilled on {rt.what(name)}: the object has been "
                "modified; please apply your changes to the latest version and try again",
                details=rt.details(name),
            )
        if cmeta.get("uid") not in (None, "", ometa["uid"]):
            raise ApiError(
                409,
                f"Precondition failed: UID in precondition: {cmeta.get('uid')}, UID in object "
                f"meta: {ometa['uid']}",
                details=rt.details(name),
            )
        if sub == "status":
            new = copy.deepcopy(old)
            new["status"] = copy.deepcopy(cand.get("status")) or {}
        else:
            new = copy.deepcopy(cand)
            new["apiVersion"], new["kind"] = rt.api_version, rt.kind
            meta = new["metadata"] = dict(cmeta)
            for k in (
                "uid",
                "creationTimestamp",
                "name",
                "namespace",
                "generation",
                "deletionTimestamp",
            ):
                if k in ometa:
                    meta[k] = ometa[k]
                else:
                    meta.pop(k, None)
            if rt.has_status:
                new["status"] = copy.deepcopy(old.get("status") or {})
            if new.get("spec") != old.get("spec"):
                meta["generation"] = int(ometa.get("generation") or 1) + 1
            validate_labels(rt, name, meta.get("labels"))
            validate_ports(rt, name, new)
            hook = getattr(self, f"_prepare_{rt.kind.lower()}", None)
            if hook:
                hook(rt, new, old)
        new["metadata"]["resourceVersion"] = ometa["resourceVersion"]
        if new == old or dry_run:
            return new
        return self._replace_obj(rt, new, old)

    def _delete(self, rt: ResourceType, obj: dict, policy: str = "Background") -> dict | None:
        meta = obj["metadata"]
        current = self._get(rt, meta.get("namespace"), meta["name"])
        if current is None or current["metadata"]["uid"] != meta["uid"]:
            return None
        uid = meta["uid"]
        if rt.plural == "namespaces":
            for t in self._by_key.values():
                if t.namespaced:
                    for o in self._objects(t, meta["name"]):
                        self._delete(t, o, "Background")
        dependents = [
            (t, o)
            for t in self._by_key.values()
            for o in self._objects(t)
            if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        ]
        for t, o in dependents:
            if policy == "Orphan":

                def strip(d: dict) -> None:
                    refs = [r for r in d["metadata"]["ownerReferences"] if r.get("uid") != uid]
                    if refs:
                        d["metadata"]["ownerReferences"] = refs
                    else:
                        d["metadata"].pop("ownerReferences", None)

                self._modify(t, o, strip)
            else:
                self._delete(t, o, policy)
        return self._remove(rt, current)

    def _emit(
        self,
        rt: ResourceType,
        obj: dict,
        etype: str,
        reason: str,
        message: str,
        component: str = "fake-controller",
    ) -> None:
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        if self._get(self._by_key["namespaces"], None, ns) is None:
            return
        ev = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {
                "kind": rt.kind,
                "namespace": meta.get("namespace"),
                "name": meta["name"],
                "uid": meta["uid"],
                "apiVersion": rt.api_version,
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": etype,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": component,
        }
        if not meta.get("namespace"):
            ev["involvedObject"].pop("namespace")
        self._create(self._by_key["events"], ns, ev)
