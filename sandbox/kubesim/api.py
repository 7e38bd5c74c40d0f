"""Request routing: a path is answered by an extra route, by discovery, or parsed into
(resource type, namespace, name, subresource) and dispatched to list, watch, create,
get, update, patch, delete, deletecollection, ``pods/log``, ``pods/eviction`` or the
``scale`` subresource of Deployments and ReplicaSets."""

from __future__ import annotations

import base64
import copy
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sandbox.kubesim.controllers.pods import PodsController
from sandbox.kubesim.discovery import Discovery
from sandbox.kubesim.errors import ApiError, status_body
from sandbox.kubesim.faults import Faults
from sandbox.kubesim.http import Response, Stream, truthy
from sandbox.kubesim.patches import json_merge_patch, json_patch, strategic_merge_patch
from sandbox.kubesim.resources import ResourceType
from sandbox.kubesim.selectors import (
    label_selector_string,
    parse_field_selector,
    parse_label_selector,
)
from sandbox.kubesim.validation import invalid
from sandbox.kubesim.watch import Watches


@dataclass
class RecordedRequest:
    """A Kubernetes API request as received, for assertions."""

    method: str
    path: str
    query: dict[str, str]
    body: str


#: The API groups whose objects take a strategic merge patch (CRDs' groups don't).
STRATEGIC_MERGE_GROUPS = ("", "apps", "autoscaling", "batch", "networking.k8s.io")

#: ``handler(method, path, query, body, headers) -> (status, body, content type)``: a
#: dict body is sent as JSON, a str as text; ``headers`` are the request's (``.get()``).
RouteHandler = Callable[[str, str, dict[str, str], bytes, Any], tuple[int, dict | str, str]]


class Api(Discovery, Watches, Faults, PodsController):
    """The Kubernetes REST API over the store, and the extra routes beside it."""

    token: str | None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: Every Kubernetes API request received (bounded), for assertions.
        self.requests: deque[RecordedRequest] = deque(maxlen=5000)
        self._routes: dict[str, RouteHandler] = {}

    def add_route(self, prefix: str, handler: RouteHandler) -> None:
        """Answer requests whose path starts with ``prefix`` with ``handler`` (the longest
        matching prefix wins). They bypass the Kubernetes routing, fault injection, the
        bearer token check (the handler sees the headers to check its own) and
        ``requests``."""
        if not prefix.startswith("/"):
            raise ValueError(f"a route prefix starts with '/', not {prefix!r}")
        with self._lock:
            self._routes[prefix] = handler

    def _route(self, path: str) -> RouteHandler | None:
        with self._lock:
            for prefix in sorted(self._routes, key=len, reverse=True):
                if path.startswith(prefix):
                    return self._routes[prefix]
        return None

    def _serve(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        raw: bytes,
        headers: Any,
        alive: Callable[[], bool],
    ) -> Response | Stream:
        """Answer one request; the HTTP layer calls this on the connection's thread."""
        route = self._route(path)
        if route is not None:
            code, content, content_type = route(method, path, dict(query), raw, headers)
            return Response(code, content, content_type)

        self.requests.append(
            RecordedRequest(method, path, dict(query), raw.decode("utf-8", "replace"))
        )
        self._inject_fault(method, path)

        if self.token is not None and headers.get("Authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized")
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise ApiError(400, f"invalid JSON body: {exc}") from exc
        path = path.rstrip("/") or "/"
        found = self._discovery(path)
        if found is not None:
            return found

        segs = [s for s in path.split("/") if s]
        if len(segs) >= 2 and segs[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segs[2:]
        elif len(segs) >= 3 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        with self._lock:
            if not rest:
                return self._api_resources(group, version)

            ns = None
            if (
                len(rest) >= 3
                and rest[0] == "namespaces"
                and (group, version, rest[2]) in self._types
            ):
                ns, rest = rest[1], rest[2:]
            rt = self._types.get((group, version, rest[0]))
            if rt is None or len(rest) > 3 or (ns is not None and not rt.namespaced):
                raise ApiError(404, "the server could not find the requested resource")
            name = rest[1] if len(rest) > 1 else None
            sub = rest[2] if len(rest) > 2 else None
            if rt.namespaced and ns is None and name is not None:
                raise ApiError(404, "the server could not find the requested resource")
            return self._dispatch(method, rt, ns, name, sub, query, body, headers, alive)

    def _dispatch(
        self,
        method: str,
        rt: ResourceType,
        ns: str | None,
        name: str | None,
        sub: str | None,
        query: dict[str, str],
        body: Any,
        headers: Any,
        alive: Callable[[], bool],
    ) -> Response | Stream:
        dry = query.get("dryRun") == "All"
        if name is None:
            if method == "GET":
                if truthy(query.get("watch")):
                    return self._watch(rt, ns, query, alive)
                return Response(200, self._list_response(rt, ns, query))
            if method == "POST":
                if rt.namespaced and ns is None:
                    raise ApiError(
                        405, "the server does not allow this method on the requested resource"
                    )
                return Response(201, self._create(rt, ns, body, dry_run=dry))
            if method == "DELETE":
                return self._delete_collection(rt, ns, query, body, dry)
            raise ApiError(405, "the server does not allow this method on the requested resource")
        if sub is None:
            if method == "GET":
                return Response(200, self._must_get(rt, ns, name))
            if method == "PUT":
                old = self._must_get(rt, ns, name)
                return Response(200, self._update(rt, old, body, dry_run=dry))
            if method == "PATCH":
                return Response(200, self._patch(rt, ns, name, body, headers, None, dry))
            if method == "DELETE":
                return self._delete_api(rt, ns, name, query, body, dry)
        elif sub == "status" and rt.has_status:
            if method == "GET":
                return Response(200, self._must_get(rt, ns, name))
            if method == "PUT":
                old = self._must_get(rt, ns, name)
                return Response(200, self._update(rt, old, body, sub="status", dry_run=dry))
            if method == "PATCH":
                return Response(200, self._patch(rt, ns, name, body, headers, "status", dry))
        elif sub == "scale" and rt.scalable:
            if method == "GET":
                return Response(200, self._scale_of(self._must_get(rt, ns, name)))
            if method in ("PUT", "PATCH"):
                return Response(200, self._set_scale(rt, ns, name, method, body, headers, dry))
        elif rt.plural == "pods" and sub == "log" and method == "GET":
            return self._log(ns or "", name, query, alive)
        elif rt.plural == "pods" and sub == "eviction" and method == "POST":
            self._must_get(rt, ns, name)
            if not dry:
                self._evict(ns or "", name, "EvictionByEvictionAPI", "Eviction API: evicting")
            return Response(201, status_body(201, "", "", status="Success"))
        else:
            raise ApiError(404, "the server could not find the requested resource")
        raise ApiError(405, "the server does not allow this method on the requested resource")

    def _patch(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        body: Any,
        headers: Any,
        sub: str | None,
        dry: bool,
    ) -> dict:
        old = self._must_get(rt, ns, name)
        cand = self._patched(rt, old, body, headers)
        if sub != "status" and rt.has_status:
            cand["status"] = copy.deepcopy(old.get("status") or {})
        # a resourceVersion in the patch is a precondition; otherwise take the current one
        patch_rv = None
        if isinstance(body, dict):
            patch_rv = (body.get("metadata") or {}).get("resourceVersion")
        cand.setdefault("metadata", {})["resourceVersion"] = (
            patch_rv or old["metadata"]["resourceVersion"]
        )
        return self._update(rt, old, cand, sub=sub, dry_run=dry)

    @staticmethod
    def _patched(rt: ResourceType, old: dict, body: Any, headers: Any) -> dict:
        """``old`` with the PATCH ``body`` applied as its Content-Type says."""
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype == "application/json-patch+json":
            cand = json_patch(old, body)
        elif ctype == "application/merge-patch+json":
            cand = json_merge_patch(old, body)
        elif ctype == "application/strategic-merge-patch+json":
            if rt.group not in STRATEGIC_MERGE_GROUPS:
                raise ApiError(415, f"strategic merge patch is not supported for {rt.key}")
            cand = strategic_merge_patch(old, body)
        else:
            raise ApiError(415, f"the body of the request was in an unknown format - {ctype}")
        if not isinstance(cand, dict):
            raise ApiError(422, "the patch did not produce an object")
        return cand

    @staticmethod
    def _scale_of(obj: dict) -> dict:
        """The autoscaling/v1 Scale of a Deployment or ReplicaSet."""
        meta, spec = obj["metadata"], obj.get("spec") or {}
        kept = ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {k: meta[k] for k in kept if k in meta},
            "spec": {"replicas": spec.get("replicas", 1)},
            "status": {
                "replicas": (obj.get("status") or {}).get("replicas", 0),
                "selector": label_selector_string(spec.get("selector")),
            },
        }

    def _set_scale(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        method: str,
        body: Any,
        headers: Any,
        dry: bool,
    ) -> dict:
        """PUT or PATCH of the ``scale`` subresource: only ``spec.replicas`` changes."""
        old = self._must_get(rt, ns, name)
        scale = body if method == "PUT" else self._patched(rt, self._scale_of(old), body, headers)
        if not isinstance(scale, dict):
            raise ApiError(400, "the request body must be a JSON object")
        replicas = (scale.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid(rt, name, "spec.replicas", replicas, "must be greater than or equal to 0")
        cand = copy.deepcopy(old)
        cand["spec"]["replicas"] = replicas
        rv = (scale.get("metadata") or {}).get("resourceVersion")
        cand["metadata"]["resourceVersion"] = rv or old["metadata"]["resourceVersion"]
        return self._scale_of(self._update(rt, old, cand, dry_run=dry))

    def _list_response(self, rt: ResourceType, ns: str | None, query: dict[str, str]) -> dict:
        lsel = parse_label_selector(query.get("labelSelector"))
        fsel = parse_field_selector(query.get("fieldSelector"))
        items = [o for o in self._objects(rt, ns) if self._matches(o, None, lsel, fsel)]
        token = query.get("continue")
        if token:
            try:
                start = tuple(json.loads(base64.urlsafe_b64decode(token.encode())))
            except ValueError as exc:
                raise ApiError(400, "continue key is not valid") from exc
            items = [
                o
                for o in items
                if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) > start
            ]
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        limit = int(query.get("limit") or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps([last.get("namespace") or "", last["name"]]).encode()
            ).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        out = []
        for o in items:
            o = copy.deepcopy(o)
            o.pop("kind", None)
            o.pop("apiVersion", None)
            out.append(o)
        return {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": meta,
            "items": out,
        }

    def _delete_options(self, query: dict[str, str], body: Any, rt: ResourceType) -> tuple:
        opts = body if isinstance(body, dict) else {}
        policy = query.get("propagationPolicy") or opts.get("propagationPolicy")
        orphan = query.get("orphanDependents") or opts.get("orphanDependents")
        explicit = bool(policy) or orphan is not None
        if not policy and orphan is not None:
            policy = "Orphan" if truthy(str(orphan)) else "Background"
        if not policy:
            # batch/v1 Jobs orphan their pods by default, as the real API does
            policy = "Orphan" if rt.key == "jobs.batch" else "Background"
        if policy not in ("Orphan", "Background", "Foreground"):
            raise ApiError(400, f"invalid propagationPolicy {policy!r}")
        return policy, explicit, opts.get("preconditions") or {}

    def _delete_api(
        self,
        rt: ResourceType,
        ns: str | None,
        name: str,
        query: dict[str, str],
        body: Any,
        dry: bool,
    ) -> Response:
        obj = self._must_get(rt, ns, name)
        policy, explicit, pre = self._delete_options(query, body, rt)
        meta = obj["metadata"]
        if pre.get("uid") and pre["uid"] != meta["uid"]:
            raise ApiError(
                409,
                f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: "
                f"{meta['uid']}",
                details=rt.details(name),
            )
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta["resourceVersion"]:
            raise ApiError(
                409,
                f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}"
                f", ResourceVersion in object meta: {meta['resourceVersion']}",
                details=rt.details(name),
            )
        headers = {}
        if rt.key == "jobs.batch" and not explicit:
            headers["Warning"] = (
                '299 - "child pods are preserved by default when jobs are deleted; set '
                "propagationPolicy=Background to remove them or set propagationPolicy=Orphan "
                'to suppress this warning"'
            )
        gone = copy.deepcopy(obj) if dry else self._delete(rt, obj, policy)
        if rt.plural == "pods":
            gone = gone or copy.deepcopy(obj)
            gone["metadata"]["deletionTimestamp"] = self._ts()
            return Response(200, gone, headers=headers)
        return Response(
            200,
            status_body(200, "", "", details=rt.details(name, meta["uid"]), status="Success"),
            headers=headers,
        )

    def _delete_collection(
        self, rt: ResourceType, ns: str | None, query: dict[str, str], body: Any, dry: bool
    ) -> Response:
        policy, _, _ = self._delete_options(query, body, rt)
        listed = self._list_response(rt, ns, {k: v for k, v in query.items() if k != "limit"})
        if not dry:
            for item in listed["items"]:
                obj = self._get(rt, item["metadata"].get("namespace"), item["metadata"]["name"])
                if obj is not None:
                    self._delete(rt, obj, policy)
        return Response(200, listed)
