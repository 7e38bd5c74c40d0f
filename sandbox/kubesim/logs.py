"""Container logs: bounded per-container buffers that the kubelet, ``append_log`` and
``PodRun`` write to, served as ``pods/log`` (tailLines, sinceSeconds/sinceTime,
timestamps, limitBytes) and followed as a stream until the container ends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from sandbox.kubesim.conditions import TERMINAL_PHASES
from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.http import Response, Stream, truthy
from sandbox.kubesim.resources import ResourceType
from sandbox.kubesim.store import Store


class LogBuffer:
    """One container's log lines with their times; keeps the last ``MAX`` lines, and a
    follower's cursor (an absolute line number) stays valid as older lines go."""

    MAX = 50_000

    def __init__(self) -> None:
        self.base = 0  # absolute index of lines[0]
        self.lines: list[tuple[float, str]] = []

    def append(self, ts: float, line: str) -> None:
        self.lines.append((ts, line))
        if len(self.lines) > self.MAX:
            drop = len(self.lines) - self.MAX
            del self.lines[:drop]
            self.base += drop

    @property
    def end(self) -> int:
        return self.base + len(self.lines)

    def since(self, cursor: int) -> list[tuple[float, str]]:
        return self.lines[max(0, cursor - self.base) :]


class Logs(Store):
    """Pod logs, keyed by (namespace, pod, container)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._logs: dict[tuple[str, str, str], LogBuffer] = {}

    def _forget(self, rt: ResourceType, obj: dict) -> None:
        super()._forget(rt, obj)
        if rt.plural == "pods":
            key = (obj["metadata"].get("namespace") or "", obj["metadata"]["name"])
            for k in [k for k in self._logs if k[:2] == key]:
                del self._logs[k]

    def append_log(self, namespace: str, pod: str, text: str, container: str | None = None) -> None:
        """Append lines to a pod container's log (the pod's first container by default)."""
        with self._cond:
            if container is None:
                p = self._get(self._by_key["pods"], namespace, pod)
                containers = ((p or {}).get("spec") or {}).get("containers") or []
                container = containers[0]["name"] if containers else ""
            buf = self._logs.setdefault((namespace, pod, container), LogBuffer())
            now = self._now()
            lines = text.splitlines(keepends=True)
            for ln in lines:
                buf.append(now, ln if ln.endswith("\n") else ln + "\n")
            self._cond.notify_all()

    def _log(self, ns: str, name: str, query: dict[str, str], alive: Callable[[], bool]) -> Any:
        rt = self._by_key["pods"]
        pod = self._must_get(rt, ns, name)
        spec = pod.get("spec") or {}
        names = [c["name"] for c in spec.get("containers") or []]
        all_names = names + [c["name"] for c in spec.get("initContainers") or []]
        container = query.get("container")
        if not container:
            if len(names) != 1:
                raise ApiError(
                    400,
                    f"a container name must be specified for pod {name}, choose one of: "
                    f"[{' '.join(names)}]",
                )
            container = names[0]
        elif container not in all_names:
            raise ApiError(400, f"container {container} is not valid for pod {name}")
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        started = any(
            s.get("name") == container and ("running" in s["state"] or "terminated" in s["state"])
            for s in statuses
        )
        if not started:
            raise ApiError(
                400,
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        key = (ns, name, container)
        uid = pod["metadata"]["uid"]
        follow = truthy(query.get("follow"))
        stamps = truthy(query.get("timestamps"))
        tail = int(query["tailLines"]) if query.get("tailLines") else None
        since = None
        if query.get("sinceSeconds"):
            since = self._now() - int(query["sinceSeconds"])
        elif query.get("sinceTime"):
            since = self._parse_ts(query["sinceTime"])
        limit = int(query["limitBytes"]) if query.get("limitBytes") else None

        def fmt(lines: list[tuple[float, str]]) -> bytes:
            if stamps:
                return "".join(
                    datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f000Z ") + s
                    for t, s in lines
                ).encode()
            return "".join(s for _, s in lines).encode()

        buf = self._logs.get(key) or LogBuffer()
        existing = [ln for ln in buf.since(0) if since is None or ln[0] >= since]
        if tail is not None:
            existing = existing[-tail:] if tail > 0 else []
        first = fmt(existing)
        if limit is not None:
            first = first[:limit]
        if not follow:
            return Response(200, first, "text/plain")
        cursor = buf.end
        return Stream("text/plain", self._follow_gen(key, uid, cursor, first, fmt, limit, alive))

    def _follow_gen(
        self,
        key: tuple[str, str, str],
        uid: str,
        cursor: int,
        first: bytes,
        fmt: Callable[[list[tuple[float, str]]], bytes],
        limit: int | None,
        alive: Callable[[], bool],
    ) -> Iterator[bytes]:
        sent = len(first)
        if first:
            yield first
        rt = self._by_key["pods"]
        while not self._stopping.is_set() and alive():
            if limit is not None and sent >= limit:
                return
            with self._cond:
                buf = self._logs.get(key)
                new = buf.since(cursor) if buf else []
                if new:
                    cursor = buf.end
                else:
                    pod = self._get(rt, key[0], key[1])
                    if (
                        pod is None
                        or pod["metadata"]["uid"] != uid
                        or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES
                    ):
                        return
                    self._cond.wait(0.25)
                    continue
            data = fmt(new)
            if limit is not None:
                data = data[: limit - sent]
            sent += len(data)
            yield data
