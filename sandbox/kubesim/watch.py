"""Watch streams: newline-delimited JSON events from a resourceVersion, ADDED/MODIFIED/
DELETED as seen through the watch's selectors, and 410 Expired once the version has
left the bounded history."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator

from sandbox.kubesim.errors import ApiError, status_body
from sandbox.kubesim.http import Stream
from sandbox.kubesim.resources import ResourceType
from sandbox.kubesim.selectors import Predicate, parse_field_selector, parse_label_selector
from sandbox.kubesim.store import Store, WatchEvent


class Watches(Store):
    """``?watch=true`` on a list path."""

    def _watch(
        self, rt: ResourceType, ns: str | None, query: dict[str, str], alive: Callable[[], bool]
    ) -> Stream:
        lsel = parse_label_selector(query.get("labelSelector"))
        fsel = parse_field_selector(query.get("fieldSelector"))
        rv_raw = query.get("resourceVersion") or ""
        try:
            rv = int(rv_raw) if rv_raw not in ("", "0") else None
        except ValueError as exc:
            raise ApiError(400, f"invalid resource version: {rv_raw!r}") from exc
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        return Stream("application/json", self._watch_gen(rt, ns, lsel, fsel, rv, timeout, alive))

    def _watch_gen(
        self,
        rt: ResourceType,
        ns: str | None,
        lsel: list[Predicate],
        fsel: list[Predicate],
        rv: int | None,
        timeout: float | None,
        alive: Callable[[], bool],
    ) -> Iterator[bytes]:
        def line(etype: str, obj: dict) -> bytes:
            return (json.dumps({"type": etype, "object": obj}) + "\n").encode()

        def gone(at: int) -> bytes:
            return line(
                "ERROR",
                status_body(
                    410,
                    "Expired",
                    f"too old resource version: {at} ({self._history_floor + 1})",
                ),
            )

        def ok(o: dict | None) -> bool:
            return o is not None and self._matches(o, ns, lsel, fsel)

        deadline = time.monotonic() + timeout if timeout else None
        with self._lock:
            if rv is None:
                first = b"".join(
                    line("ADDED", copy.deepcopy(o)) for o in self._objects(rt, ns) if ok(o)
                )
                cursor = self._rv
            elif rv < self._history_floor:
                first, cursor = gone(rv), -1
            else:
                first, cursor = b"", rv
        if first:
            yield first
        if cursor < 0:
            return
        while not self._stopping.is_set():
            remaining = deadline - time.monotonic() if deadline else 0.25
            if remaining <= 0 or not alive():
                return
            with self._cond:
                if cursor < self._history_floor:
                    expired = True
                    batch: list[WatchEvent] = []
                else:
                    expired = False
                    batch = []
                    for e in reversed(self._history):
                        if e.rv <= cursor:
                            break
                        if e.key == rt.key:
                            batch.append(e)
                    batch.reverse()
                    if self._rv == cursor:
                        self._cond.wait(min(0.25, remaining))
                        continue
                    cursor = self._rv
            if expired:
                yield gone(cursor)
                return
            out = []
            for e in batch:
                new_ok = ok(e.obj)
                if e.type == "MODIFIED":
                    old_ok = ok(e.old)
                    if new_ok and old_ok:
                        out.append(line("MODIFIED", e.obj))
                    elif new_ok:
                        out.append(line("ADDED", e.obj))
                    elif old_ok:
                        out.append(line("DELETED", e.obj))
                elif new_ok:
                    out.append(line(e.type, e.obj))
            if out:
                yield b"".join(out)

    def expire_watch_history(self) -> None:
        """Forget all watch history: any watch from an older resourceVersion gets 410."""
        with self._cond:
            self._history.clear()
            self._history_floor = self._rv
            self._cond.notify_all()
