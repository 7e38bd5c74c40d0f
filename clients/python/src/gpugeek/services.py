"""`client.services`: the organisation's inference services (HTTP endpoints served by
replicas that the console scales), their revisions, replicas and endpoint tokens."""

from __future__ import annotations

import time
from typing import Any

from gpugeek.errors import GpuGeekError
from gpugeek.http import Transport
from gpugeek.models import (
    Service,
    ServiceReplica,
    ServiceRevision,
    ServiceScaleEvent,
    ServiceToken,
)

# A service in one of these has stopped changing on its own.
SETTLED = ("ready", "scaled_to_zero", "failed")


class Services:
    def __init__(self, http: Transport):
        self.http = http

    def list(self) -> list[Service]:
        return [Service.from_dict(row) for row in self.http.paginate("services")]

    def get(self, service_id: int) -> Service:
        return Service.from_dict(self.http.get(f"services/{int(service_id)}"))

    def create(
        self,
        name: str,
        *,
        image: str,
        command: list[str],
        port: int,
        region: str,
        cpus: int = 1,
        min_replicas: int = 2,
        max_replicas: int = 10,
        readiness_path: str = "/",
        env: dict[str, str] | None = None,
        auth: str = "token",
        autoscale: dict[str, Any] | None = None,
        priority: str = "normal",
        secrets: list[str] | None = None,
        volumes: list[dict[str, Any]] | None = None,
        gpu_type: str | None = None,
        gpus_per_replica: int = 0,
    ) -> Service:
        """Create a service (revision 1) and start its replicas. `auth`: "token" (callers
        send a service token, see `create_token`) or "public". `autoscale`: what the
        console scales on, {"metric": "concurrency" (requests in flight per replica, the
        default, target 10), "rps" (requests per second per replica) or, on a cluster,
        "cpu" (utilisation in percent, by its autoscaler), "target": N}.
        `priority`: "critical" (owners and admins) keeps serving when a budget is used up;
        "normal" and "low" scale to zero until it is raised. `secrets`: organisation
        secrets by name, set in each replica's environment. `volumes`: the organisation's
        volumes every replica mounts read-only, [{"name": "weights", "path": "/models"}]
        (model weights; a volume filled from a bucket). `gpu_type` (a slug, e.g. "h100")
        and `gpus_per_replica` (1 by default once a type is named): GPU replicas, on the
        region's cluster, which may scale on {"metric": "gpu", "target": 70}. A
        `Conflict` when the name
        is taken; a `ValidationError` naming the field for bad input."""
        body: dict[str, Any] = {
            "name": name, "image": image, "command": list(command), "port": port,
            "region": region, "cpus": cpus, "min_replicas": min_replicas,
            "max_replicas": max_replicas, "readiness_path": readiness_path,
            "env": dict(env or {}), "auth": auth, "priority": priority,
            "secrets": list(secrets or []),
            "volumes": [dict(mount) for mount in volumes or []],
            "gpu_type": gpu_type, "gpus_per_replica": gpus_per_replica,
        }  # fmt: skip
        if autoscale is not None:
            body["autoscale"] = dict(autoscale)
        return Service.from_dict(self.http.post("services", body))

    def update(self, service_id: int, **changes: Any) -> Service:
        """Change any of image, command, port, cpus, gpus_per_replica, env, secrets, volumes,
        readiness_path, auth, priority (a new revision when what runs changes) or
        min/max_replicas."""
        answer = self.http.request("PATCH", f"services/{int(service_id)}", json=changes)
        return Service.from_dict(answer)

    def autoscale(
        self,
        service_id: int,
        *,
        metric: str,
        target: float,
        scale_down_delay: int | None = None,
    ) -> Service:
        """Scale on `metric` ("concurrency", "rps" or, on a cluster, "cpu" in percent) per
        replica, aiming at `target`;
        `scale_down_delay`: seconds the traffic must want fewer replicas before one goes."""
        autoscale: dict[str, Any] = {"metric": metric, "target": target}
        if scale_down_delay is not None:
            autoscale["scale_down_delay"] = scale_down_delay
        body = {"autoscale": autoscale}
        return Service.from_dict(
            self.http.request("PATCH", f"services/{int(service_id)}", json=body)
        )

    def scale(self, service_id: int, *, min_replicas: int, max_replicas: int) -> Service:
        body = {"min_replicas": min_replicas, "max_replicas": max_replicas}
        return Service.from_dict(self.http.post(f"services/{int(service_id)}/scale", body))

    def rollback(self, service_id: int, revision: int) -> Service:
        """Run an earlier revision again (copied into a new revision)."""
        body = {"revision": int(revision)}
        return Service.from_dict(self.http.post(f"services/{int(service_id)}/rollback", body))

    def delete(self, service_id: int) -> None:
        """Delete the service: its replicas stop and its endpoint answers 404."""
        self.http.request("DELETE", f"services/{int(service_id)}")

    def revisions(self, service_id: int) -> list[ServiceRevision]:
        rows = self.http.get(f"services/{int(service_id)}/revisions")
        return [ServiceRevision.from_dict(row) for row in rows]

    def replicas(self, service_id: int) -> list[ServiceReplica]:
        rows = self.http.get(f"services/{int(service_id)}/replicas")
        return [ServiceReplica.from_dict(row) for row in rows]

    def replica_logs(self, service_id: int, replica_id: int, *, tail: int = 200) -> list[str]:
        """The replica's latest `tail` log lines (1 to 5000), oldest first."""
        answer = self.http.get(
            f"services/{int(service_id)}/replicas/{int(replica_id)}/logs", tail=int(tail)
        )
        return list(answer["lines"])

    def scale_events(self, service_id: int) -> list[ServiceScaleEvent]:
        """The latest changes of the wanted replica count, newest first, with what the
        autoscaler saw."""
        rows = self.http.get(f"services/{int(service_id)}/scale-events")
        return [ServiceScaleEvent.from_dict(row) for row in rows]

    def tokens(self, service_id: int) -> list[ServiceToken]:
        rows = self.http.get(f"services/{int(service_id)}/tokens")
        return [ServiceToken.from_dict(row) for row in rows]

    def create_token(self, service_id: int, name: str) -> ServiceToken:
        """A token for calling the endpoint; its `token` is shown only in this answer."""
        row = self.http.post(f"services/{int(service_id)}/tokens", {"name": name})
        return ServiceToken.from_dict(row)

    def revoke_token(self, service_id: int, token_id: int) -> None:
        self.http.request("DELETE", f"services/{int(service_id)}/tokens/{int(token_id)}")

    def wait(self, service_id: int, *, timeout: float = 600, poll: float = 2) -> Service:
        """The service once it is ready, scaled to zero or failed (see `status_reason`);
        GpuGeekError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            service = self.get(service_id)
            if service.status in SETTLED:
                return service
            if time.monotonic() >= deadline:
                raise GpuGeekError(f"service {service_id} is still {service.status}")
            time.sleep(poll)
