"""Fault injection: answer matching requests with an error, hold them, or cut their
connection; the next N of them (``fail_next``, ``delay_next``, ``reset_next``) or, for
a while, a random share of them (``fail_fraction``, ``slow_fraction``).

Faults are checked when a request arrives, so a watch or log stream is affected only
when it connects."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from sandbox.kubesim.errors import ApiError
from sandbox.kubesim.http import ResetConnection
from sandbox.kubesim.store import Store


@dataclass
class Fault:
    method: str
    pattern: re.Pattern
    kind: str  # "fail" | "delay" | "reset"
    times: int | None
    status: int = 500
    seconds: float = 0.0
    message: str | None = None
    retry_after: int | None = None
    fraction: float = 1.0  # the share of matching requests it hits
    until: float | None = None  # time.monotonic() when it ends; None: until used up or cleared


class Faults(Store):
    """Faults, checked in the order they were added; the first that hits applies."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._faults: list[Fault] = []

    def fail_next(
        self,
        method: str,
        path_regex: str,
        status: int = 500,
        times: int | None = 1,
        message: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """Answer the next ``times`` matching requests (None: all until clear_faults) with a
        ``Status`` error. ``method`` may be "*"; ``path_regex`` is searched in the URL path
        (without the query string)."""
        self._add_fault(
            Fault(
                method.upper(),
                re.compile(path_regex),
                "fail",
                times,
                status=status,
                message=message,
                retry_after=retry_after,
            )
        )

    def delay_next(
        self, method: str, path_regex: str, seconds: float, times: int | None = 1
    ) -> None:
        """Hold the next matching requests for ``seconds`` before serving them normally
        (a write still happens even if the client has given up, as on a real server)."""
        self._add_fault(
            Fault(method.upper(), re.compile(path_regex), "delay", times, seconds=seconds)
        )

    def reset_next(self, method: str, path_regex: str, times: int | None = 1) -> None:
        """Close the connection of the next matching requests without any response."""
        self._add_fault(Fault(method.upper(), re.compile(path_regex), "reset", times))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _add_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def fail_fraction(
        self,
        fraction: float,
        seconds: float,
        status: int = 500,
        path_regex: str = ".*",
        method: str = "*",
    ) -> None:
        """For ``seconds`` from now (wall-clock time), answer each matching request with
        probability ``fraction`` with a ``Status`` error of code ``status``."""
        self._add_fault(
            Fault(
                method.upper(),
                re.compile(path_regex),
                "fail",
                None,
                status=status,
                fraction=_checked_fraction(fraction),
                until=time.monotonic() + seconds,
            )
        )

    def slow_fraction(
        self,
        fraction: float,
        seconds: float,
        delay: float,
        path_regex: str = ".*",
        method: str = "*",
    ) -> None:
        """For ``seconds`` from now (wall-clock time), hold each matching request with
        probability ``fraction`` for ``delay`` seconds before serving it normally."""
        self._add_fault(
            Fault(
                method.upper(),
                re.compile(path_regex),
                "delay",
                None,
                seconds=delay,
                fraction=_checked_fraction(fraction),
                until=time.monotonic() + seconds,
            )
        )

    def _take_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            now = time.monotonic()
            self._faults[:] = [f for f in self._faults if f.until is None or now < f.until]
            for f in self._faults:
                if f.method in ("*", method) and f.pattern.search(path):
                    if f.fraction < 1 and self._rand.random() >= f.fraction:
                        continue
                    if f.times is not None:
                        f.times -= 1
                        if f.times <= 0:
                            self._faults.remove(f)
                    return f
        return None

    def _inject_fault(self, method: str, path: str) -> None:
        """Apply the fault that hits this request, if any: wait, cut or raise."""
        fault = self._take_fault(method, path)
        if fault is not None:
            if fault.kind == "delay":
                self._stopping.wait(fault.seconds)
            elif fault.kind == "reset":
                raise ResetConnection
            else:
                extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
                raise ApiError(
                    fault.status,
                    fault.message or f"injected failure ({fault.status})",
                    headers=extra,
                )


def _checked_fraction(fraction: float) -> float:
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be between 0 and 1, not {fraction!r}")
    return fraction
