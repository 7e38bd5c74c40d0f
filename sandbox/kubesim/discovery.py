"""Discovery: health checks, ``/version``, ``/api``, ``/apis`` and each group version's
APIResourceList, built from the registered resource types."""

from __future__ import annotations

from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.http import Response
from sandbox.kubesim.store import Store


class Discovery(Store):
    """What a client asks before it calls a resource."""

    port: int | None

    def _discovery(self, path: str) -> Response | None:
        """The answer for a health, version or group-list path; None for any other."""

        if path in ("/healthz", "/livez", "/readyz"):
            return Response(200, "ok", "text/plain")
        if path == "/version":
            return Response(
                200,
                {
                    "major": "1",
                    "minor": "33",
                    "gitVersion": "v1.33.0-fake",
                    "gitCommit": "0" * 40,
                    "gitTreeState": "clean",
                    "buildDate": "2025-04-23T00:00:00Z",
                    "goVersion": "go1.24.2",
                    "compiler": "gc",
                    "platform": "linux/amd64",
                },
            )
        if path == "/api":
            return Response(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"127.0.0.1:{self.port}"}
                    ],
                },
            )
        if path == "/apis":
            with self._lock:
                groups: dict[str, list[str]] = {}
                for g, v, _ in self._types:
                    if g and v not in groups.setdefault(g, []):
                        groups[g].append(v)
            return Response(
                200,
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in vs],
                            "preferredVersion": {"groupVersion": f"{g}/{vs[0]}", "version": vs[0]},
                        }
                        for g, vs in sorted(groups.items())
                    ],
                },
            )
        return None

    def _api_resources(self, group: str, version: str) -> Response:
        """The APIResourceList of one group version (call with the lock held)."""

        verbs = ["create", "delete", "deletecollection", "get", "list", "patch"]
        verbs += ["update", "watch"]
        resources = []
        for (g, v, _), t in sorted(self._types.items()):
            if (g, v) != (group, version):
                continue
            resources.append(
                {
                    "name": t.plural,
                    "singularName": t.kind.lower(),
                    "kind": t.kind,
                    "namespaced": t.namespaced,
                    "verbs": verbs,
                }
            )
            if t.has_status:
                resources.append(
                    {
                        "name": f"{t.plural}/status",
                        "singularName": "",
                        "kind": t.kind,
                        "namespaced": t.namespaced,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if t.scalable:
                resources.append(
                    {
                        "name": f"{t.plural}/scale",
                        "singularName": "",
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "namespaced": True,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if t.plural == "pods":
                for sub, kind, sv in (
                    ("log", "Pod", ["get"]),
                    ("eviction", "Eviction", ["create"]),
                ):
                    resources.append(
                        {
                            "name": f"pods/{sub}",
                            "singularName": "",
                            "kind": kind,
                            "namespaced": True,
                            "verbs": sv,
                        }
                    )
        if not resources:
            raise ApiError(404, "the server could not find the requested resource")
        return Response(
            200,
            {
                "kind": "APIResourceList",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources,
            },
        )
