"""A small, real-HTTP fake Kubernetes API server for tests.

No kube-apiserver can run on our machines, so tests talk HTTP, through the official
``kubernetes`` client, to this server. It runs in-process on ``127.0.0.1:<free port>``
in background threads and speaks the real API's paths, JSON bodies, ``Status`` errors,
watch streams (newline-delimited JSON, 410 on expired resourceVersions) and pod log
streams, plus a fake controller (Job controller + scheduler + kubelet) and fault
injection.

Typical use (the ``kube_api`` fixture is registered for every test by
``pytest_plugins = ["tests.fakes.fixtures"]`` in tests/conftest.py; request it by name)::

    def test_something(kube_api, tmp_path):
        kube_api.add_node("gpu-1", labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
        core = kubernetes.client.CoreV1Api(kube_api.api_client())
        ...
        kube_api.tick()  # run the fake controllers now (they also run every 50 ms)

Real-cluster behaviour it reproduces on purpose (code under test must cope with it):

- Deleting a batch/v1 Job without ``propagationPolicy`` orphans its pods (with the real
  ``Warning`` header); pass ``propagation_policy="Background"`` (or Foreground).
- Job status omits zero counts (``active``/``succeeded``/``failed`` are None, not 0);
  list items carry no ``kind``/``apiVersion``; no-op updates keep the resourceVersion.
- Creating in a missing namespace is 404; a stale ``resourceVersion`` on PUT is 409;
  status written through the main resource is ignored (use the ``/status`` subresource).
- Logs of a container that has not started are a 400 ("waiting to start").
- Pod creation over a ResourceQuota is 403; a Job then records a ``FailedCreate`` event.
- urllib3 (under the client) retries idempotent requests on read timeouts/connection
  resets 3 times, and any 429/503 that carries ``Retry-After``: fault injection with
  ``times=1`` may be invisible to the caller for those.

Fidelity notes (differences from a real cluster) are listed in ``LIMITATIONS`` below.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import random
import re
import select
import socket
import sys
import threading
import time
import traceback
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from kubernetes import client as k8s_client

__all__ = [
    "LIMITATIONS",
    "ApiError",
    "KubeAPIServer",
    "PodRun",
    "ResourceType",
]

LIMITATIONS = """
- Deletion is immediate: no graceful termination, no Terminating namespaces, no finalizers.
- Strategic-merge patch is a JSON merge patch plus list merging by the usual merge keys
  (containers/env/volumes by name, volumeMounts by mountPath, ...); server-side apply
  (application/apply-patch+yaml) answers 415.
- fieldSelector accepts any dotted path (the real API allows only a few per resource).
- Pod spec immutability is not enforced; Job immutability is (selector, completionMode,
  completions, template except scheduling directives of a suspended, never-started Job).
- The Job controller recreates failed pods at once (no exponential back-off), ignores
  backoffLimitPerIndex/successPolicy, and treats FailIndex as Count; restartPolicy
  OnFailure containers are not restarted in place: fail_pod() always fails the pod.
- Evicted pods (evict_pod, the eviction subresource) stay as Failed pods with a
  DisruptionTarget condition instead of being deleted; PodDisruptionBudgets don't exist.
- The scheduler binds first-fit by node name on nodeSelector, required node affinity,
  taints/tolerations, readiness and allocatable resources; no preemption, no spreading.
- ResourceQuota: pods/requests.*/limits.*/cpu/memory/count/* keys, enforced on create only;
  LimitRange: only Container default/defaultRequest are applied.
- Watch: no bookmarks; without a resourceVersion (or "0") the current objects are sent
  as ADDED first. Watches without timeoutSeconds run until the client leaves or stop().
"""

# --------------------------------------------------------------------------- basics

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910")
JOB_INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generateName
_TERMINAL = ("Succeeded", "Failed")

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int,
    reason: str | None,
    message: str,
    details: dict | None = None,
    status: str = "Failure",
) -> dict:
    """A ``kind: Status`` body as the real API server returns it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": status,
        "message": message,
        "reason": reason if reason is not None else _REASONS.get(code, ""),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """Raised inside the server; becomes a ``Status`` response."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict | None = None,
        headers: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason if reason is not None else _REASONS.get(code, "")
        self.details = details
        self.headers = headers or {}

    def body(self) -> dict:
        return status_body(self.code, self.reason, self.message, self.details)


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def details(self, name: str, uid: str | None = None) -> dict:
        d = {"name": name, "kind": self.plural}
        if self.group:
            d["group"] = self.group
        if uid:
            d["uid"] = uid
        return d

    def what(self, name: str) -> str:
        return f'{self.key} "{name}"'


BUILTIN_TYPES = (
    ResourceType("", "v1", "namespaces", "Namespace", False),
    ResourceType("", "v1", "nodes", "Node", False),
    ResourceType("", "v1", "pods", "Pod", True),
    ResourceType("", "v1", "services", "Service", True),
    ResourceType("", "v1", "secrets", "Secret", True, has_status=False),
    ResourceType("", "v1", "configmaps", "ConfigMap", True, has_status=False),
    ResourceType("", "v1", "serviceaccounts", "ServiceAccount", True, has_status=False),
    ResourceType("", "v1", "events", "Event", True, has_status=False),
    ResourceType("", "v1", "resourcequotas", "ResourceQuota", True),
    ResourceType("", "v1", "limitranges", "LimitRange", True, has_status=False),
    ResourceType("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    ResourceType("batch", "v1", "jobs", "Job", True),
    ResourceType("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy", True, False),
)


@dataclass
class PodRun:
    """What a started pod does, as returned by ``server.pod_script(pod)``.

    ``duration`` seconds after it starts (None: forever) the pod ends with ``exit_code``;
    ``logs`` are appended to its first container's log when it starts.
    """

    duration: float | None = None
    exit_code: int = 0
    logs: tuple[str, ...] | list[str] = ()


@dataclass
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    body: str


@dataclass
class _Fault:
    method: str
    pattern: re.Pattern
    kind: str  # "fail" | "delay" | "reset"
    times: int | None
    status: int = 500
    seconds: float = 0.0
    message: str | None = None
    retry_after: int | None = None


@dataclass
class _Event:
    rv: int
    type: str
    key: str
    obj: dict
    old: dict | None


@dataclass
class _JobBook:
    counted: set = field(default_factory=set)  # uids of terminal pods already counted
    active: set = field(default_factory=set)  # uids of pods seen active
    ctrl_deleted: set = field(default_factory=set)  # uids the controller deleted itself
    ok_idx: set = field(default_factory=set)
    succeeded: int = 0
    failed: int = 0
    fail_reason: tuple[str, str] | None = None
    last_create_error: str | None = None


class _LogBuf:
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


class _ResetConnection(Exception):
    pass


# --------------------------------------------------------------------------- quantities

_QTY = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:([eE][+-]?\d+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?$"
)
_SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


def parse_quantity(value: Any) -> Fraction:
    """Parse a Kubernetes quantity ("500m", "1Ti", "8", 2) into a Fraction."""
    if isinstance(value, int | float):
        return Fraction(str(value))
    m = _QTY.match(str(value).strip())
    if not m:
        raise ValueError(f"quantities must match the regular expression: {value!r}")
    num = Fraction(m.group(1))
    if m.group(2):
        num *= Fraction(10) ** int(m.group(2)[1:])
    elif m.group(3):
        num *= _SUFFIX[m.group(3)]
    return num


def format_quantity(q: Fraction) -> str:
    if q.denominator == 1:
        return str(q.numerator)
    milli = q * 1000
    if milli.denominator == 1:
        return f"{milli.numerator}m"
    return str(float(q))


# --------------------------------------------------------------------------- selectors

_LABEL_TERM = re.compile(
    r"^\s*(!)?\s*([A-Za-z0-9._/-]+)\s*"
    r"(?:(==|=|!=)\s*([A-Za-z0-9._-]*)|(in|notin)\s*\(([^)]*)\))?\s*$"
)
_FIELD_TERM = re.compile(r"^\s*([A-Za-z0-9._\[\]/-]+)\s*(==|=|!=)\s*(.*?)\s*$")

Predicate = Callable[[dict], bool]


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, []
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [t for t in out if t.strip()]


def parse_label_selector(selector: str | None) -> list[Predicate]:
    """``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``, ``!k``."""
    preds: list[Predicate] = []
    for term in _split_top(selector or ""):
        m = _LABEL_TERM.match(term)
        if not m:
            raise ApiError(400, f"unable to parse requirement: {term.strip()!r}")
        neg, key, op, val, setop, setvals = m.groups()
        if neg:
            if op or setop:
                raise ApiError(400, f"unable to parse requirement: {term.strip()!r}")
            preds.append(lambda lb, k=key: k not in lb)
        elif op in ("=", "=="):
            preds.append(lambda lb, k=key, v=val: lb.get(k) == v)
        elif op == "!=":
            preds.append(lambda lb, k=key, v=val: lb.get(k) != v)
        elif setop:
            vals = frozenset(x.strip() for x in setvals.split(",") if x.strip())
            if setop == "in":
                preds.append(lambda lb, k=key, vs=vals: lb.get(k) in vs)
            else:
                preds.append(lambda lb, k=key, vs=vals: lb.get(k) not in vs)
        else:
            preds.append(lambda lb, k=key: k in lb)
    return preds


def _path_value(obj: Any, path: str) -> str:
    cur = obj
    for part in path.split("."):
        if not isinstance(cur, dict):
            return ""
        cur = cur.get(part)
    if cur is None:
        return ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    return str(cur)


def parse_field_selector(selector: str | None) -> list[Predicate]:
    """Comma-joined ``path=value`` / ``path!=value`` on any dotted path of the object."""
    preds: list[Predicate] = []
    for term in (selector or "").split(","):
        if not term.strip():
            continue
        m = _FIELD_TERM.match(term)
        if not m:
            raise ApiError(400, f"invalid selector: '{selector}'; can't understand '{term}'")
        path, op, val = m.groups()
        if op == "!=":
            preds.append(lambda o, p=path, v=val: _path_value(o, p) != v)
        else:
            preds.append(lambda o, p=path, v=val: _path_value(o, p) == v)
    return preds


def label_selector_from_dict(sel: dict | None) -> list[Predicate]:
    """A metav1.LabelSelector (matchLabels/matchExpressions) as predicates on labels."""
    preds: list[Predicate] = []
    for k, v in ((sel or {}).get("matchLabels") or {}).items():
        preds.append(lambda lb, k=k, v=v: lb.get(k) == v)
    for expr in (sel or {}).get("matchExpressions") or []:
        k, op, vals = expr.get("key"), expr.get("operator"), set(expr.get("values") or [])
        if op == "In":
            preds.append(lambda lb, k=k, vs=vals: lb.get(k) in vs)
        elif op == "NotIn":
            preds.append(lambda lb, k=k, vs=vals: lb.get(k) not in vs)
        elif op == "Exists":
            preds.append(lambda lb, k=k: k in lb)
        elif op == "DoesNotExist":
            preds.append(lambda lb, k=k: k not in lb)
    return preds


# --------------------------------------------------------------------------- patches

_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "volumeDevices": ("devicePath",),
    "ports": ("containerPort", "port"),
    "imagePullSecrets": ("name",),
    "conditions": ("type",),
    "ownerReferences": ("uid",),
    "hostAliases": ("ip",),
    "topologySpreadConstraints": ("topologyKey",),
}


def json_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = json_merge_patch(result.get(k), v)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A JSON merge patch that merges well-known lists by their merge key."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if not k.startswith("$")}
    result = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            result.pop(k, None)
            continue
        old = result.get(k)
        keys = _MERGE_KEYS.get(k)
        if keys and isinstance(v, list) and isinstance(old, list):
            mk = next(
                (c for c in keys if all(isinstance(i, dict) and c in i for i in old + v)), None
            )
            if mk is not None:
                merged = [copy.deepcopy(i) for i in old]
                for item in v:
                    pos = next((n for n, o in enumerate(merged) if o.get(mk) == item.get(mk)), None)
                    if item.get("$patch") == "delete":
                        if pos is not None:
                            merged.pop(pos)
                    elif pos is None:
                        merged.append(strategic_merge_patch({}, item))
                    else:
                        merged[pos] = strategic_merge_patch(merged[pos], item)
                result[k] = merged
                continue
        result[k] = strategic_merge_patch(old, v)
    return result


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise ApiError(422, f"invalid JSON pointer {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def json_patch(doc: Any, ops: list) -> Any:
    """RFC 6902: add, remove, replace, test, copy, move."""
    doc = copy.deepcopy(doc)

    def parent(parts: list[str]) -> tuple[Any, str]:
        cur = doc
        for p in parts[:-1]:
            try:
                cur = cur[int(p)] if isinstance(cur, list) else cur[p]
            except (KeyError, IndexError, ValueError, TypeError) as exc:
                raise ApiError(422, f"doc is missing path: {'/'.join(parts)}") from exc
        return cur, parts[-1]

    def get(parts: list[str]) -> Any:
        cur = doc
        for p in parts:
            try:
                cur = cur[int(p)] if isinstance(cur, list) else cur[p]
            except (KeyError, IndexError, ValueError, TypeError) as exc:
                raise ApiError(422, f"doc is missing path: /{'/'.join(parts)}") from exc
        return cur

    def add(parts: list[str], value: Any) -> None:
        nonlocal doc
        if not parts:
            doc = value
            return
        par, last = parent(parts)
        if isinstance(par, list):
            par.insert(len(par) if last == "-" else int(last), value)
        elif isinstance(par, dict):
            par[last] = value
        else:
            raise ApiError(422, f"doc is missing path: /{'/'.join(parts)}")

    def remove(parts: list[str]) -> Any:
        get(parts)
        par, last = parent(parts)
        return par.pop(int(last)) if isinstance(par, list) else par.pop(last)

    if not isinstance(ops, list):
        raise ApiError(400, "json patch must be a list of operations")
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind == "add":
            add(parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            remove(parts)
        elif kind == "replace":
            remove(parts)
            add(parts, copy.deepcopy(op.get("value")))
        elif kind == "test":
            if get(parts) != op.get("value"):
                raise ApiError(422, f"testing value {op.get('path')} failed")
        elif kind in ("copy", "move"):
            src = _pointer(op.get("from", ""))
            value = copy.deepcopy(get(src)) if kind == "copy" else remove(src)
            add(parts, value)
        else:
            raise ApiError(422, f"unexpected json patch operation {kind!r}")
    return doc


# --------------------------------------------------------------------------- validation

_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME_RE = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


def _invalid(rt: ResourceType, name: str, field_path: str, value: Any, msg: str) -> ApiError:
    shown = json.dumps(value) if not isinstance(value, str) else f'"{value}"'
    return ApiError(
        422,
        f'{rt.kind}{"." + rt.group if rt.group else ""} "{name}" is invalid: '
        f"{field_path}: Invalid value: {shown}: {msg}",
        details={**rt.details(name), "causes": [{"field": field_path, "message": msg}]},
    )


def _validate_name(rt: ResourceType, name: str) -> None:
    if rt.plural in ("namespaces", "services"):
        regex, maxlen = (_LABEL_RE if rt.plural == "namespaces" else _DNS1035_RE), 63
        what = "a lowercase RFC 1123 label" if rt.plural == "namespaces" else "a DNS-1035 label"
    else:
        regex, maxlen = _SUBDOMAIN_RE, (63 if rt.plural == "jobs" else 253)
        what = "a lowercase RFC 1123 subdomain"
    if len(name) > maxlen:
        raise _invalid(rt, name, "metadata.name", name, f"must be no more than {maxlen} characters")
    if not regex.match(name):
        raise _invalid(
            rt,
            name,
            "metadata.name",
            name,
            f"{what} must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character",
        )


def _validate_labels(rt: ResourceType, name: str, labels: Any) -> None:
    if labels is None:
        return
    if not isinstance(labels, dict):
        raise _invalid(rt, name, "metadata.labels", labels, "must be a map")
    for k, v in labels.items():
        prefix, _, lname = k.rpartition("/")
        ok = (
            bool(_LABEL_NAME_RE.match(lname))
            and len(lname) <= 63
            and (not prefix or (len(prefix) <= 253 and _SUBDOMAIN_RE.match(prefix)))
        )
        if not ok:
            raise _invalid(rt, name, "metadata.labels", k, "name part must be a valid label key")
        if not isinstance(v, str) or len(v) > 63 or (v and not _LABEL_NAME_RE.match(v)):
            raise _invalid(
                rt,
                name,
                "metadata.labels",
                v,
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character "
                "(at most 63 characters)",
            )


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _set_condition(
    conds: list[dict], ctype: str, status: str, reason: str, message: str, ts: str
) -> None:
    """Set a condition; empty reason/message are omitted, as the real API does."""
    for c in conds:
        if c.get("type") == ctype:
            if c.get("status") != status or (c.get("reason") or "") != reason:
                c.update(status=status, lastTransitionTime=ts, lastProbeTime=ts)
            elif (c.get("message") or "") == message:
                return
            break
    else:
        c = {"type": ctype, "status": status, "lastTransitionTime": ts, "lastProbeTime": ts}
        conds.append(c)
    for k, v in (("reason", reason), ("message", message)):
        if v:
            c[k] = v
        else:
            c.pop(k, None)


def _condition(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


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


# --------------------------------------------------------------------------- HTTP layer


@dataclass
class _Response:
    code: int
    body: Any
    content_type: str = "application/json"
    headers: dict = field(default_factory=dict)


@dataclass
class _Stream:
    content_type: str
    chunks: Iterator[bytes]
    headers: dict = field(default_factory=dict)


def _peer_closed(sock: socket.socket) -> bool:
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return False
        return sock.recv(1, socket.MSG_PEEK) == b""
    except (OSError, ValueError):
        return True


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    kube: KubeAPIServer

    def __init__(self, addr: tuple[str, int], handler: type) -> None:
        super().__init__(addr, handler)
        self._conn_lock = threading.Lock()
        self.conns: set[socket.socket] = set()
        self.handler_threads: set[threading.Thread] = set()

    def process_request(self, request: Any, client_address: Any) -> None:
        t = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name="fake-kube-api-conn",
            daemon=True,
        )
        with self._conn_lock:
            self.conns.add(request)
            self.handler_threads.add(t)
        t.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._conn_lock:
                self.conns.discard(request)
                self.handler_threads.discard(threading.current_thread())

    def close_connections(self) -> None:
        with self._conn_lock:
            conns = list(self.conns)
        for s in conns:
            with suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError | OSError):
            return
        self.kube.errors.append(traceback.format_exc())


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fake-kube-apiserver/1.0"
    disable_nagle_algorithm = True  # headers and body are separate writes: avoid 40 ms stalls
    server: _HTTPServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        kube = self.server.kube
        split = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            resp = kube._serve(
                method,
                split.path,
                query,
                raw,
                self.headers,
                lambda: not _peer_closed(self.connection),
            )
        except _ResetConnection:
            self.close_connection = True
            with suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return
        except ApiError as e:
            resp = _Response(e.code, e.body(), headers=e.headers)
        except Exception as e:
            kube.errors.append(traceback.format_exc())
            resp = _Response(500, status_body(500, None, f"fake kube-apiserver bug: {e!r}"))
        try:
            if isinstance(resp, _Stream):
                self._send_stream(resp)
            else:
                self._send(resp)
        except (ConnectionError, TimeoutError, OSError):
            self.close_connection = True

    def _send(self, resp: _Response) -> None:
        body = resp.body
        if isinstance(body, dict | list):
            data = json.dumps(body).encode()
        elif isinstance(body, str):
            data = body.encode()
        else:
            data = body or b""
        self.send_response(resp.code)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Audit-Id", str(uuid.uuid4()))
        for k, v in resp.headers.items():
            self.send_header(k, str(v))
        self.end_headers()
        self.wfile.write(data)

    def _send_stream(self, resp: _Stream) -> None:
        self.send_response(200)
        self.send_header("Content-Type", resp.content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Cache-Control", "no-cache, private")
        for k, v in resp.headers.items():
            self.send_header(k, str(v))
        self.end_headers()
        try:
            for chunk in resp.chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.write(b"0\r\n\r\n")
        finally:
            close = getattr(resp.chunks, "close", None)
            if close:
                close()
        if self.server.kube._stopping.is_set():
            self.close_connection = True


# --------------------------------------------------------------------------- the server


class KubeAPIServer:
    """An in-process fake kube-apiserver with a fake Job controller, scheduler and kubelet.

    Thread-safe: every store access holds one re-entrant lock; streaming responses wait
    on a condition of that lock and end when the server stops.
    """

    def __init__(
        self,
        *,
        auto_tick: float | None = 0.05,
        watch_history: int = 1000,
        token: str | None = None,
        namespaces: tuple[str, ...] = ("default", "kube-system", "kube-public"),
    ) -> None:
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._by_key: dict[str, ResourceType] = {}
        self._store: dict[str, dict[tuple[str, str], dict]] = {}
        self._rv = 0
        self._history: deque[_Event] = deque(maxlen=watch_history)
        self._history_floor = 0
        self._faults: list[_Fault] = []
        self._logs: dict[tuple[str, str, str], _LogBuf] = {}
        self._books: dict[str, _JobBook] = {}
        self._pod_runs: dict[str, tuple[float, int]] = {}
        self._bound_at: dict[str, float] = {}
        self._sched_msgs: dict[str, str] = {}
        self._rand = random.Random()
        self._ips = itertools.count(2)
        self._clock_offset = 0.0
        self._paused = 0
        self._clients: list[k8s_client.ApiClient] = []
        self._httpd: _HTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self.auto_tick = auto_tick
        self.token = token
        self.port: int | None = None
        #: Called with a copy of each pod when it starts running; may return a PodRun.
        self.pod_script: Callable[[dict], PodRun | None] | None = None
        #: Seconds between binding a pod to a node and it Running.
        self.pod_start_delay = 0.0
        #: Every request received (bounded), for assertions.
        self.requests: deque[RecordedRequest] = deque(maxlen=5000)
        #: Tracebacks of bugs inside the fake (the fixture fails the test if any).
        self.errors: list[str] = []
        for rt in BUILTIN_TYPES:
            self.register_resource(rt)
        for ns in namespaces:
            self.create("namespaces", {"metadata": {"name": ns}})

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> KubeAPIServer:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.kube = self
        self._httpd = httpd
        self.port = httpd.server_address[1]
        serve = threading.Thread(
            target=httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-kube-api",
            daemon=True,
        )
        serve.start()
        self._threads = [serve]
        if self.auto_tick:
            ctl = threading.Thread(target=self._controller_loop, name="fake-kube-ctl", daemon=True)
            ctl.start()
            self._threads.append(ctl)
        return self

    def stop(self) -> None:
        httpd = self._httpd
        if httpd is None:
            return
        self._stopping.set()
        with self._cond:
            self._cond.notify_all()
        httpd.shutdown()
        for c in self._clients:
            with suppress(Exception):
                c.close()
        self._clients.clear()
        httpd.close_connections()
        httpd.server_close()
        deadline = time.monotonic() + 3
        for t in [*self._threads, *list(httpd.handler_threads)]:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._httpd = None

    def __enter__(self) -> KubeAPIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _controller_loop(self) -> None:
        while not self._stopping.wait(self.auto_tick or 0.05):
            if self._paused:
                continue
            try:
                self.tick()
            except Exception:
                self.errors.append(traceback.format_exc())

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Pause the automatic controller (and the helpers' implicit tick)."""
        with self._lock:
            self._paused += 1
        try:
            yield
        finally:
            with self._lock:
                self._paused -= 1

    # ------------------------------------------------------------------ client config

    def configuration(self) -> k8s_client.Configuration:
        cfg = k8s_client.Configuration(host=self.url)
        cfg.api_key = {"BearerToken": self.token or "fake-token"}
        cfg.api_key_prefix = {"BearerToken": "Bearer"}
        return cfg

    def api_client(self) -> k8s_client.ApiClient:
        """A fresh ``kubernetes.client.ApiClient`` for this server (closed on stop())."""
        c = k8s_client.ApiClient(self.configuration())
        self._clients.append(c)
        return c

    def kubeconfig_dict(self, namespace: str = "default") -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": self.token or "fake-token"}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {"cluster": "fake", "user": "fake", "namespace": namespace},
                }
            ],
            "current-context": "fake",
        }

    def kubeconfig_path(self, directory: str | Path, namespace: str = "default") -> Path:
        """Write a kubeconfig for ``kubernetes.config.load_kube_config`` and return its path."""
        path = Path(directory) / "kubeconfig"
        path.write_text(yaml.safe_dump(self.kubeconfig_dict(namespace)))
        return path

    # ------------------------------------------------------------------ registry & clock

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

    def advance_clock(self, seconds: float) -> None:
        """Move the fake's clock (activeDeadlineSeconds, TTLs, PodRun durations) forward."""
        with self._lock:
            self._clock_offset += seconds
        self._react()

    @property
    def resource_version(self) -> int:
        return self._rv

    # ------------------------------------------------------------------ store primitives

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
        self._history.append(_Event(self._rv, etype, rt.key, copy.deepcopy(obj), old))
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
        if rt.plural == "pods":
            uid = meta["uid"]
            self._pod_runs.pop(uid, None)
            self._bound_at.pop(uid, None)
            self._sched_msgs.pop(uid, None)
            for k in [k for k in self._logs if k[:2] == key]:
                del self._logs[k]
        elif rt.key == "jobs.batch":
            self._books.pop(meta["uid"], None)
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

    # ------------------------------------------------------------------ create/update/delete

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
                raise _invalid(rt, "", "metadata.name", "", "name or generateName is required")
            for _ in range(50):
                name = meta["generateName"] + "".join(self._rand.choices(_NAME_CHARS, k=5))
                if self._get(rt, ns, name) is None:
                    break
            meta["name"] = name
        _validate_name(rt, name)
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
        _validate_labels(rt, name, meta.get("labels"))
        hook = getattr(self, f"_prepare_{rt.kind.lower()}", None)
        if hook:
            hook(rt, obj, None)
        _validate_labels(rt, name, meta.get("labels"))
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
            _validate_labels(rt, name, meta.get("labels"))
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

    # ------------------------------------------------------------------ per-kind hooks

    def _prepare_namespace(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        meta = obj["metadata"]
        meta["labels"] = {**(meta.get("labels") or {}), "kubernetes.io/metadata.name": meta["name"]}
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        if old is None:
            obj["status"] = {"phase": "Active"}

    def _prepare_node(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        if old is None:
            st = obj.setdefault("status", {})
            st.setdefault("capacity", {})
            st.setdefault("allocatable", dict(st["capacity"]))
            st.setdefault(
                "conditions",
                [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": self._ts(),
                        "lastTransitionTime": self._ts(),
                    }
                ],
            )

    def _prepare_pod(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        if old is not None:
            return
        name = obj["metadata"]["name"]
        spec = obj.get("spec")
        if not isinstance(spec, dict) or not spec.get("containers"):
            raise _invalid(rt, name, "spec.containers", [], "Required value")
        for i, c in enumerate(spec["containers"] + (spec.get("initContainers") or [])):
            if not c.get("name"):
                raise _invalid(rt, name, f"spec.containers[{i}].name", "", "Required value")
            if not c.get("image"):
                raise _invalid(rt, name, f"spec.containers[{i}].image", "", "Required value")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault(
                "imagePullPolicy",
                "Always"
                if c["image"].endswith(":latest") or ":" not in c["image"]
                else "IfNotPresent",
            )
            res = c.setdefault("resources", {})
            for which in ("requests", "limits"):
                for k, v in (res.get(which) or {}).items():
                    try:
                        parse_quantity(v)
                    except ValueError as exc:
                        raise _invalid(
                            rt, name, f"spec.containers[{i}].resources.{which}[{k}]", v, str(exc)
                        ) from exc
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("dnsPolicy", "ClusterFirst")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("securityContext", {})
        spec.setdefault("priority", 0)
        obj["status"] = {"phase": "Pending", "qosClass": self._qos(spec)}

    @staticmethod
    def _qos(spec: dict) -> str:
        res = [c.get("resources") or {} for c in spec.get("containers") or []]
        if not any((r.get("requests") or r.get("limits")) for r in res):
            return "BestEffort"
        for r in res:
            lim, req = r.get("limits") or {}, r.get("requests") or {}
            for k in ("cpu", "memory"):
                if k not in lim or req.get(k, lim[k]) != lim[k]:
                    return "Burstable"
        return "Guaranteed"

    def _prepare_job(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        meta, name = obj["metadata"], obj["metadata"]["name"]
        spec = obj.get("spec")
        if not isinstance(spec, dict):
            raise _invalid(rt, name, "spec", None, "Required value")
        template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
        spec["template"] = template
        tspec = template.get("spec") if isinstance(template.get("spec"), dict) else {}
        if old is None:
            if not tspec.get("containers"):
                raise _invalid(rt, name, "spec.template.spec.containers", [], "Required value")
            if tspec.get("restartPolicy") not in ("OnFailure", "Never"):
                raise _invalid(
                    rt,
                    name,
                    "spec.template.spec.restartPolicy",
                    tspec.get("restartPolicy") or "",
                    'Required value: valid values: "OnFailure", "Never"',
                )
            if spec.get("podFailurePolicy") and tspec.get("restartPolicy") != "Never":
                raise _invalid(
                    rt,
                    name,
                    "spec.template.spec.restartPolicy",
                    tspec.get("restartPolicy"),
                    'only "Never" is supported when podFailurePolicy is specified',
                )
            spec.setdefault("completionMode", "NonIndexed")
            if spec["completionMode"] == "Indexed" and spec.get("completions") is None:
                raise _invalid(
                    rt, name, "spec.completions", None, "when completion mode is Indexed"
                )
            if spec.get("parallelism") is None and spec.get("completions") is None:
                spec["completions"] = 1
            spec.setdefault("parallelism", 1)
            if spec.get("backoffLimitPerIndex") is None:
                spec.setdefault("backoffLimit", 6)
            spec.setdefault("suspend", False)
            spec.setdefault("manualSelector", None)
            if spec["manualSelector"] is None:
                spec.pop("manualSelector")
            spec.setdefault(
                "podReplacementPolicy",
                "Failed" if spec.get("podFailurePolicy") else "TerminatingOrFailed",
            )
            uid = meta["uid"]
            ctl = {
                "batch.kubernetes.io/controller-uid": uid,
                "batch.kubernetes.io/job-name": name,
                "controller-uid": uid,
                "job-name": name,
            }
            spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
            tmeta = template.get("metadata") if isinstance(template.get("metadata"), dict) else {}
            template["metadata"] = tmeta
            tmeta["labels"] = {**(tmeta.get("labels") or {}), **ctl}
            if not meta.get("labels"):
                meta["labels"] = dict(tmeta["labels"])
            return
        ospec = old.get("spec") or {}
        for f in ("selector", "completionMode", "podFailurePolicy"):
            if spec.get(f) != ospec.get(f):
                raise _invalid(rt, name, f"spec.{f}", spec.get(f), "field is immutable")
        if spec.get("completions") != ospec.get("completions") and not (
            spec.get("completionMode") == "Indexed"
            and spec.get("completions") == spec.get("parallelism")
        ):
            raise _invalid(
                rt, name, "spec.completions", spec.get("completions"), "field is immutable"
            )
        mutable = ("nodeSelector", "tolerations", "affinity", "schedulingGates")

        def strip(t: dict) -> dict:
            t = copy.deepcopy(t or {})
            (t.get("metadata") or {}).pop("labels", None)
            (t.get("metadata") or {}).pop("annotations", None)
            for k in mutable:
                (t.get("spec") or {}).pop(k, None)
            return t

        otmpl = ospec.get("template") or {}
        if strip(template) != strip(otmpl):
            raise _invalid(rt, name, "spec.template", "...", "field is immutable")
        if template != otmpl:
            suspended_unstarted = ospec.get("suspend") and not (old.get("status") or {}).get(
                "startTime"
            )
            if not suspended_unstarted:
                raise _invalid(
                    rt,
                    name,
                    "spec.template",
                    "...",
                    "field is immutable (scheduling directives may change only while the "
                    "Job is suspended and has not started)",
                )

    def _prepare_service(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for p in spec.get("ports") or []:
            p.setdefault("protocol", "TCP")
            if "port" in p:
                p.setdefault("targetPort", p["port"])
        ospec = (old or {}).get("spec") or {}
        if old is not None and ospec.get("clusterIP"):
            if spec.get("clusterIP") not in (None, "", ospec["clusterIP"]):
                raise _invalid(
                    rt,
                    obj["metadata"]["name"],
                    "spec.clusterIP",
                    spec["clusterIP"],
                    "field is immutable",
                )
            spec["clusterIP"] = ospec["clusterIP"]
        elif not spec.get("clusterIP"):
            n = next(self._ips)
            spec["clusterIP"] = f"10.96.{n // 250 % 250}.{n % 250 + 1}"
        spec["clusterIPs"] = [spec["clusterIP"]]

    def _prepare_secret(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        obj.setdefault("type", "Opaque")
        sd = obj.pop("stringData", None)
        if sd:
            data = dict(obj.get("data") or {})
            for k, v in sd.items():
                data[k] = base64.b64encode(str(v).encode()).decode()
            obj["data"] = data

    def _prepare_event(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        if old is None:
            obj.setdefault("count", 1)
            obj.setdefault("firstTimestamp", self._ts())
            obj.setdefault("lastTimestamp", obj["firstTimestamp"])
            obj.setdefault("type", "Normal")

    def _prepare_resourcequota(self, rt: ResourceType, obj: dict, old: dict | None) -> None:
        hard = (obj.get("spec") or {}).get("hard") or {}
        for k, v in hard.items():
            try:
                parse_quantity(v)
            except ValueError as exc:
                raise _invalid(rt, obj["metadata"]["name"], f"spec.hard[{k}]", v, str(exc)) from exc
        ns = obj["metadata"]["namespace"]
        obj["status"] = {
            "hard": dict(hard),
            "used": {k: format_quantity(v) for k, v in self._quota_usage(ns, hard).items()},
        }

    # ------------------------------------------------------------------ admission

    @staticmethod
    def _pod_resources(pod: dict, which: str = "requests") -> dict[str, Fraction]:
        def one(c: dict) -> dict[str, Fraction]:
            res = c.get("resources") or {}
            vals = dict(res.get("limits") or {}) if which == "requests" else {}
            vals.update(res.get(which) or {})
            return {k: parse_quantity(v) for k, v in vals.items()}

        spec = pod.get("spec") or {}
        total: Counter = Counter()
        for c in spec.get("containers") or []:
            total.update(one(c))
        for c in spec.get("initContainers") or []:
            for k, v in one(c).items():
                total[k] = max(total[k], v)
        return dict(total)

    def _quota_usage(
        self, ns: str, hard: dict, extra_pod: dict | None = None, extra_rt: str | None = None
    ) -> dict[str, Fraction]:
        pods = [
            p
            for p in self._objects(self._by_key["pods"], ns)
            if (p.get("status") or {}).get("phase") not in _TERMINAL
        ]
        if extra_pod is not None:
            pods.append(extra_pod)
        used: dict[str, Fraction] = {}
        for key in hard:
            if key == "pods":
                used[key] = Fraction(len(pods))
            elif key.startswith("limits."):
                res = key[len("limits.") :]
                used[key] = sum(
                    (self._pod_resources(p, "limits").get(res, 0) for p in pods), Fraction(0)
                )
            elif key.startswith("requests.") or key in ("cpu", "memory", "ephemeral-storage"):
                res = key.removeprefix("requests.")
                used[key] = sum((self._pod_resources(p).get(res, 0) for p in pods), Fraction(0))
            else:
                rkey = key.removeprefix("count/")
                try:
                    t = self._rt(rkey)
                except KeyError:
                    used[key] = Fraction(0)
                    continue
                n = len(self._objects(t, ns)) + (1 if extra_rt == t.key else 0)
                used[key] = Fraction(n)
        return used

    def _admit(self, rt: ResourceType, obj: dict) -> None:
        ns = obj["metadata"].get("namespace")
        if not ns:
            return
        name = obj["metadata"]["name"]
        if rt.plural == "pods":
            self._apply_limit_ranges(obj)
        for q in self._objects(self._by_key["resourcequotas"], ns):
            hard = (q.get("spec") or {}).get("hard") or {}
            if not hard:
                continue
            qname = q["metadata"]["name"]
            if rt.plural == "pods":
                need = [
                    k
                    for k in hard
                    if k in ("cpu", "memory", "requests.cpu", "requests.memory")
                    or k in ("limits.cpu", "limits.memory")
                ]
                missing = []
                for k in need:
                    which = "limits" if k.startswith("limits.") else "requests"
                    res = k.split(".")[-1]
                    for c in obj["spec"]["containers"]:
                        r = c.get("resources") or {}
                        vals = dict(r.get("limits") or {}) if which == "requests" else {}
                        vals.update(r.get(which) or {})
                        if res not in vals:
                            missing.append(k)
                            break
                if missing:
                    raise ApiError(
                        403,
                        f'pods "{name}" is forbidden: failed quota: {qname}: must specify '
                        + ",".join(sorted(missing)),
                        details={"name": name, "kind": "pods"},
                    )
                before = self._quota_usage(ns, hard)
                after = self._quota_usage(ns, hard, extra_pod=obj)
            else:
                before = self._quota_usage(ns, hard)
                after = self._quota_usage(ns, hard, extra_rt=rt.key)
            over = [k for k in hard if after[k] > before[k] and after[k] > parse_quantity(hard[k])]
            if over:
                req = ",".join(f"{k}={format_quantity(after[k] - before[k])}" for k in over)
                use = ",".join(f"{k}={format_quantity(before[k])}" for k in over)
                lim = ",".join(f"{k}={hard[k]}" for k in over)
                raise ApiError(
                    403,
                    f"{rt.what(name)} is forbidden: exceeded quota: {qname}, "
                    f"requested: {req}, used: {use}, limited: {lim}",
                    details=rt.details(name),
                )

    def _apply_limit_ranges(self, pod: dict) -> None:
        ns = pod["metadata"]["namespace"]
        for lr in self._objects(self._by_key["limitranges"], ns):
            for item in (lr.get("spec") or {}).get("limits") or []:
                if item.get("type") != "Container":
                    continue
                for c in pod["spec"]["containers"] + (pod["spec"].get("initContainers") or []):
                    res = c.setdefault("resources", {})
                    if item.get("default"):
                        lim = res.setdefault("limits", {})
                        for k, v in item["default"].items():
                            lim.setdefault(k, v)
                    if item.get("defaultRequest"):
                        req = res.setdefault("requests", {})
                        for k, v in item["defaultRequest"].items():
                            req.setdefault(k, v)
                    for k, v in (res.get("limits") or {}).items():
                        res.setdefault("requests", {}).setdefault(k, v)

    # ------------------------------------------------------------------ HTTP dispatch

    def _take_fault(self, method: str, path: str) -> _Fault | None:
        with self._lock:
            for f in self._faults:
                if f.method in ("*", method) and f.pattern.search(path):
                    if f.times is not None:
                        f.times -= 1
                        if f.times <= 0:
                            self._faults.remove(f)
                    return f
        return None

    def _serve(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        raw: bytes,
        headers: Any,
        alive: Callable[[], bool],
    ) -> _Response | _Stream:
        self.requests.append(
            RecordedRequest(method, path, dict(query), raw.decode("utf-8", "replace"))
        )
        fault = self._take_fault(method, path)
        if fault is not None:
            if fault.kind == "delay":
                self._stopping.wait(fault.seconds)
            elif fault.kind == "reset":
                raise _ResetConnection
            else:
                extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
                raise ApiError(
                    fault.status,
                    fault.message or f"injected failure ({fault.status})",
                    headers=extra,
                )
        if self.token is not None and headers.get("Authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthorized")
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError as exc:
                raise ApiError(400, f"invalid JSON body: {exc}") from exc
        path = path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return _Response(200, "ok", "text/plain")
        if path == "/version":
            return _Response(
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
            return _Response(
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
            return _Response(
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
        segs = [s for s in path.split("/") if s]
        if len(segs) >= 2 and segs[:2] == ["api", "v1"]:
            group, version, rest = "", "v1", segs[2:]
        elif len(segs) >= 3 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise ApiError(404, "the server could not find the requested resource")
        with self._lock:
            if not rest:
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
                return _Response(
                    200,
                    {
                        "kind": "APIResourceList",
                        "groupVersion": f"{group}/{version}" if group else version,
                        "resources": resources,
                    },
                )
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
    ) -> _Response | _Stream:
        dry = query.get("dryRun") == "All"
        if name is None:
            if method == "GET":
                if _truthy(query.get("watch")):
                    return self._watch(rt, ns, query, alive)
                return _Response(200, self._list_response(rt, ns, query))
            if method == "POST":
                if rt.namespaced and ns is None:
                    raise ApiError(
                        405, "the server does not allow this method on the requested resource"
                    )
                return _Response(201, self._create(rt, ns, body, dry_run=dry))
            if method == "DELETE":
                return self._delete_collection(rt, ns, query, body, dry)
            raise ApiError(405, "the server does not allow this method on the requested resource")
        if sub is None:
            if method == "GET":
                return _Response(200, self._must_get(rt, ns, name))
            if method == "PUT":
                old = self._must_get(rt, ns, name)
                return _Response(200, self._update(rt, old, body, dry_run=dry))
            if method == "PATCH":
                return _Response(200, self._patch(rt, ns, name, body, headers, None, dry))
            if method == "DELETE":
                return self._delete_api(rt, ns, name, query, body, dry)
        elif sub == "status" and rt.has_status:
            if method == "GET":
                return _Response(200, self._must_get(rt, ns, name))
            if method == "PUT":
                old = self._must_get(rt, ns, name)
                return _Response(200, self._update(rt, old, body, sub="status", dry_run=dry))
            if method == "PATCH":
                return _Response(200, self._patch(rt, ns, name, body, headers, "status", dry))
        elif rt.plural == "pods" and sub == "log" and method == "GET":
            return self._log(ns or "", name, query, alive)
        elif rt.plural == "pods" and sub == "eviction" and method == "POST":
            self._must_get(rt, ns, name)
            if not dry:
                self._evict(ns or "", name, "EvictionByEvictionAPI", "Eviction API: evicting")
            return _Response(201, status_body(201, "", "", status="Success"))
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
        ctype = (headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype == "application/json-patch+json":
            cand = json_patch(old, body)
        elif ctype == "application/merge-patch+json":
            cand = json_merge_patch(old, body)
        elif ctype == "application/strategic-merge-patch+json":
            if rt.group not in ("", "batch", "networking.k8s.io"):
                raise ApiError(415, f"strategic merge patch is not supported for {rt.key}")
            cand = strategic_merge_patch(old, body)
        else:
            raise ApiError(415, f"the body of the request was in an unknown format - {ctype}")
        if not isinstance(cand, dict):
            raise ApiError(422, "the patch did not produce an object")
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
            policy = "Orphan" if _truthy(str(orphan)) else "Background"
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
    ) -> _Response:
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
            return _Response(200, gone, headers=headers)
        return _Response(
            200,
            status_body(200, "", "", details=rt.details(name, meta["uid"]), status="Success"),
            headers=headers,
        )

    def _delete_collection(
        self, rt: ResourceType, ns: str | None, query: dict[str, str], body: Any, dry: bool
    ) -> _Response:
        policy, _, _ = self._delete_options(query, body, rt)
        listed = self._list_response(rt, ns, {k: v for k, v in query.items() if k != "limit"})
        if not dry:
            for item in listed["items"]:
                obj = self._get(rt, item["metadata"].get("namespace"), item["metadata"]["name"])
                if obj is not None:
                    self._delete(rt, obj, policy)
        return _Response(200, listed)

    # ------------------------------------------------------------------ watch

    def _watch(
        self, rt: ResourceType, ns: str | None, query: dict[str, str], alive: Callable[[], bool]
    ) -> _Stream:
        lsel = parse_label_selector(query.get("labelSelector"))
        fsel = parse_field_selector(query.get("fieldSelector"))
        rv_raw = query.get("resourceVersion") or ""
        try:
            rv = int(rv_raw) if rv_raw not in ("", "0") else None
        except ValueError as exc:
            raise ApiError(400, f"invalid resource version: {rv_raw!r}") from exc
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        return _Stream("application/json", self._watch_gen(rt, ns, lsel, fsel, rv, timeout, alive))

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
                    batch: list[_Event] = []
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

    # ------------------------------------------------------------------ logs

    def append_log(self, namespace: str, pod: str, text: str, container: str | None = None) -> None:
        """Append lines to a pod container's log (the pod's first container by default)."""
        with self._cond:
            if container is None:
                p = self._get(self._by_key["pods"], namespace, pod)
                containers = ((p or {}).get("spec") or {}).get("containers") or []
                container = containers[0]["name"] if containers else ""
            buf = self._logs.setdefault((namespace, pod, container), _LogBuf())
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
        follow = _truthy(query.get("follow"))
        stamps = _truthy(query.get("timestamps"))
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

        buf = self._logs.get(key) or _LogBuf()
        existing = [ln for ln in buf.since(0) if since is None or ln[0] >= since]
        if tail is not None:
            existing = existing[-tail:] if tail > 0 else []
        first = fmt(existing)
        if limit is not None:
            first = first[:limit]
        if not follow:
            return _Response(200, first, "text/plain")
        cursor = buf.end
        return _Stream("text/plain", self._follow_gen(key, uid, cursor, first, fmt, limit, alive))

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
                        or (pod.get("status") or {}).get("phase") in _TERMINAL
                    ):
                        return
                    self._cond.wait(0.25)
                    continue
            data = fmt(new)
            if limit is not None:
                data = data[: limit - sent]
            sent += len(data)
            yield data

    # ------------------------------------------------------------------ faults

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
            _Fault(
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
            _Fault(method.upper(), re.compile(path_regex), "delay", times, seconds=seconds)
        )

    def reset_next(self, method: str, path_regex: str, times: int | None = 1) -> None:
        """Close the connection of the next matching requests without any response."""
        self._add_fault(_Fault(method.upper(), re.compile(path_regex), "reset", times))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def _add_fault(self, fault: _Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    # ------------------------------------------------------------------ direct store helpers

    def get(self, resource: str, namespace: str | None, name: str) -> dict | None:
        """A copy of an object, or None."""
        with self._lock:
            obj = self._get(self._rt(resource), namespace, name)
            return copy.deepcopy(obj) if obj is not None else None

    def list(
        self,
        resource: str,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict]:
        with self._lock:
            rt = self._rt(resource)
            lsel = parse_label_selector(label_selector)
            fsel = parse_field_selector(field_selector)
            return [
                copy.deepcopy(o)
                for o in self._objects(rt, namespace)
                if self._matches(o, None, lsel, fsel)
            ]

    def create(self, resource: str, obj: dict, namespace: str | None = None) -> dict:
        """Create an object directly (same validation and admission as the API)."""
        with self._lock:
            return copy.deepcopy(self._create(self._rt(resource), namespace, obj))

    def mutate(
        self, resource: str, namespace: str | None, name: str, fn: Callable[[dict], None]
    ) -> dict:
        """Change an object in place through ``fn(obj)`` (status included), as a controller
        would; emits a MODIFIED event when anything changed."""
        with self._lock:
            rt = self._rt(resource)
            return copy.deepcopy(self._modify(rt, self._must_get(rt, namespace, name), fn))

    def delete(
        self, resource: str, namespace: str | None, name: str, propagation: str = "Background"
    ) -> None:
        with self._lock:
            rt = self._rt(resource)
            self._delete(rt, self._must_get(rt, namespace, name), propagation)

    def job_pods(self, namespace: str, job: str) -> list[dict]:
        """Copies of the pods the named Job owns (terminal ones included), by name."""
        with self._lock:
            j = self._get(self._by_key["jobs.batch"], namespace, job)
            if j is None:
                return []
            return [copy.deepcopy(p) for p in self._owned_pods(j)]

    def wait_for(self, predicate: Callable[[], Any], timeout: float = 5.0) -> Any:
        """Tick until ``predicate()`` is truthy; return its value or raise TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            self.tick()
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout:.1f}s")
            time.sleep(0.02)

    # ------------------------------------------------------------------ node helpers

    def add_node(
        self,
        name: str,
        labels: dict[str, str] | None = None,
        allocatable: dict[str, str] | None = None,
        taints: list[dict] | None = None,
        capacity: dict[str, str] | None = None,
        ready: bool = True,
        unschedulable: bool = False,
    ) -> dict:
        """Add a simulated node (8 NVIDIA GPUs, 96 CPUs, 1Ti by default)."""
        alloc = dict(
            allocatable
            if allocatable is not None
            else {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1Ti"}
        )
        alloc.setdefault("pods", "110")
        n = next(self._ips)
        ts = self._ts()
        node = {
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
            },
            "spec": {"taints": list(taints or [])},
            "status": {
                "capacity": dict(capacity or alloc),
                "allocatable": alloc,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True" if ready else "False",
                        "reason": "KubeletReady" if ready else "KubeletNotReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": ts,
                        "lastTransitionTime": ts,
                    }
                ],
                "addresses": [
                    {"type": "InternalIP", "address": f"10.0.{n // 250 % 250}.{n % 250 + 1}"},
                    {"type": "Hostname", "address": name},
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name + ".boot")),
                    "containerRuntimeVersion": "containerd://2.0.0",
                    "kernelVersion": "6.8.0-fake",
                    "kubeProxyVersion": "",
                    "kubeletVersion": "v1.33.0-fake",
                    "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, name).hex,
                    "operatingSystem": "linux",
                    "osImage": "Ubuntu 24.04 LTS",
                    "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
                },
            },
        }
        if not taints:
            node["spec"].pop("taints")
        if unschedulable:
            node["spec"]["unschedulable"] = True
        with self._lock:
            obj = self._create(self._by_key["nodes"], None, node, keep_status=True)
        self._react()
        return copy.deepcopy(obj)

    def set_node_ready(self, name: str, ready: bool) -> None:
        def fn(n: dict) -> None:
            for c in n["status"]["conditions"]:
                if c["type"] == "Ready":
                    c["status"] = "True" if ready else "False"
                    c["reason"] = "KubeletReady" if ready else "KubeletNotReady"
                    c["lastTransitionTime"] = self._ts()

        with self._lock:
            rt = self._by_key["nodes"]
            self._modify(rt, self._must_get(rt, None, name), fn)
        self._react()

    def remove_node(self, name: str) -> None:
        """Delete a node; its running pods fail with DisruptionTarget/DeletionByPodGC."""
        with self._lock:
            rt = self._by_key["nodes"]
            self._delete(rt, self._must_get(rt, None, name))
            for p in self._objects(self._by_key["pods"]):
                if (p.get("spec") or {}).get("nodeName") == name and p["status"].get(
                    "phase"
                ) not in _TERMINAL:
                    self._terminate(
                        p,
                        "Failed",
                        137,
                        "Error",
                        disruption=("DeletionByPodGC", "PodGC: node no longer exists"),
                    )
        self._react()

    # ------------------------------------------------------------------ pod helpers

    def succeed_pod(self, namespace: str, name: str, exit_code: int = 0) -> dict:
        """End a pod with phase Succeeded (its containers exit with ``exit_code``)."""
        return self._end_pod(namespace, name, "Succeeded", exit_code, "Completed")

    def fail_pod(
        self, namespace: str, name: str, exit_code: int = 1, reason: str = "Error"
    ) -> dict:
        """End a pod with phase Failed (its containers exit with ``exit_code``)."""
        return self._end_pod(namespace, name, "Failed", exit_code, reason)

    def succeed_job(self, namespace: str, job: str) -> None:
        """Make every active pod of a Job succeed."""
        for p in self.job_pods(namespace, job):
            if p["status"].get("phase") not in _TERMINAL:
                self.succeed_pod(namespace, p["metadata"]["name"])

    def _end_pod(self, ns: str, name: str, phase: str, code: int, reason: str) -> dict:
        with self._lock:
            pod = self._must_get(self._by_key["pods"], ns, name)
            out = self._terminate(pod, phase, code, reason)
        self._react()
        return copy.deepcopy(out)

    def evict_pod(
        self,
        namespace: str,
        name: str,
        reason: str = "EvictionByEvictionAPI",
        message: str | None = None,
    ) -> dict:
        """Disrupt a pod: it becomes Failed (exit code 137) with a ``DisruptionTarget``
        condition of ``reason`` (EvictionByEvictionAPI, PreemptionByScheduler,
        DeletionByTaintManager, TerminationByKubelet, DeletionByPodGC)."""
        default_msgs = {
            "EvictionByEvictionAPI": "Eviction API: evicting",
            "PreemptionByScheduler": "default-scheduler: preempting to accommodate a higher "
            "priority pod",
            "DeletionByTaintManager": "Taint manager: deleting due to NoExecute taint",
            "TerminationByKubelet": "Kubelet: node-pressure eviction",
        }
        out = self._evict(namespace, name, reason, message or default_msgs.get(reason, reason))
        self._react()
        return out

    def _evict(self, ns: str, name: str, reason: str, message: str) -> dict:
        with self._lock:
            rt = self._by_key["pods"]
            pod = self._must_get(rt, ns, name)
            if pod["status"].get("phase") in _TERMINAL:
                return copy.deepcopy(pod)
            out = self._terminate(pod, "Failed", 137, "Error", disruption=(reason, message))
            self._emit(
                rt,
                out,
                "Warning",
                "Preempted" if reason == "PreemptionByScheduler" else "Evicted",
                message,
            )
            return copy.deepcopy(out)

    def _terminate(
        self,
        pod: dict,
        phase: str,
        code: int,
        reason: str,
        disruption: tuple[str, str] | None = None,
    ) -> dict:
        ts = self._ts()

        def fn(p: dict) -> None:
            st = p.setdefault("status", {})
            st["phase"] = phase
            prev = {s["name"]: s for s in st.get("containerStatuses") or []}
            statuses = []
            for c in p["spec"]["containers"]:
                old = prev.get(c["name"], {})
                started = (old.get("state") or {}).get("running", {}).get("startedAt", ts)
                statuses.append(
                    {
                        "name": c["name"],
                        "image": c.get("image"),
                        "imageID": old.get("imageID", ""),
                        "containerID": old.get("containerID", ""),
                        "ready": False,
                        "started": False,
                        "restartCount": old.get("restartCount", 0),
                        "state": {
                            "terminated": {
                                "exitCode": code,
                                "reason": reason,
                                "startedAt": started,
                                "finishedAt": ts,
                                "containerID": old.get("containerID", ""),
                            }
                        },
                    }
                )
            st["containerStatuses"] = statuses
            conds = st.setdefault("conditions", [])
            why = "PodCompleted" if phase == "Succeeded" else "PodFailed"
            for ctype in ("Ready", "ContainersReady"):
                _set_condition(conds, ctype, "False", why, "", ts)
            if disruption:
                _set_condition(conds, "DisruptionTarget", "True", disruption[0], disruption[1], ts)

        self._pod_runs.pop(pod["metadata"]["uid"], None)
        return self._modify(self._by_key["pods"], pod, fn)

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

    # ------------------------------------------------------------------ controllers

    def _react(self) -> None:
        if not self._paused:
            self.tick()

    def tick(self, max_passes: int = 10) -> None:
        """Run the fake controllers until nothing changes (at most ``max_passes`` passes)."""
        with self._lock:
            for _ in range(max_passes):
                before = self._rv
                self._kueue_pass()
                self._jobset_pass()
                self._jobs_pass()
                self._pods_pass()
                self._quota_pass()
                if self._rv == before:
                    break

    # ------------------------------------------------------------------ Kueue and JobSet

    #: Whether the fake Kueue admits what its queues hold (a test holds it to see a wait).
    kueue_admits = True
    #: Why it doesn't, as Kueue would put it in the Workload's QuotaReserved condition.
    kueue_hold_message = "couldn't assign flavors to pod set main: insufficient unused quota"

    def install_kueue(self) -> None:
        """Serve Kueue's API (kueue.x-k8s.io/v1beta1) with a small admission controller:
        a Job or JobSet labelled `kueue.x-k8s.io/queue-name` gets a Workload (labelled
        with its uid); while its LocalQueue and that queue's ClusterQueue exist and
        `kueue_admits`, the active Workload is admitted and the object unsuspended, all
        its pod sets at once; a deactivated one (`spec.active: false`) is evicted and
        the object suspended again. No quota arithmetic: tests decide by holding it."""
        for plural, kind, namespaced in (
            ("clusterqueues", "ClusterQueue", False),
            ("localqueues", "LocalQueue", True),
            ("workloads", "Workload", True),
            ("resourceflavors", "ResourceFlavor", False),
        ):
            self.register_resource(
                ResourceType("kueue.x-k8s.io", "v1beta1", plural, kind, namespaced)
            )

    def install_jobset(self) -> None:
        """Serve JobSet (jobset.x-k8s.io/v1alpha2) with its controller's essentials: one
        Job `<jobset>-<replicatedJob>-<index>` per replica from the template (labels
        kept, owned by the JobSet), `suspend` passed down (and the pod template's
        metadata copied again on resume), Failed when a Job fails, Completed when all
        complete."""
        self.register_resource(
            ResourceType("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet", True)
        )

    @staticmethod
    def _true(obj: dict, ctype: str) -> bool:
        cond = _condition(obj, ctype)
        return bool(cond and cond.get("status") == "True")

    def _finished(self, obj: dict) -> bool:
        return any(self._true(obj, c) for c in ("Complete", "Completed", "Failed"))

    def _kueue_pass(self) -> None:
        wl_rt = self._by_key.get("workloads.kueue.x-k8s.io")
        if wl_rt is None:
            return
        owners = [
            (self._by_key["jobs.batch"], o) for o in self._objects(self._by_key["jobs.batch"])
        ]
        js_rt = self._by_key.get("jobsets.jobset.x-k8s.io")
        if js_rt is not None:
            owners += [(js_rt, o) for o in self._objects(js_rt)]
        for rt, obj in owners:
            meta = obj["metadata"]
            queue = (meta.get("labels") or {}).get("kueue.x-k8s.io/queue-name")
            if not queue or meta.get("deletionTimestamp") or self._finished(obj):
                continue
            ns, uid = meta["namespace"], meta["uid"]
            workload = next(
                (
                    w
                    for w in self._objects(wl_rt, ns)
                    if (w["metadata"].get("labels") or {}).get("kueue.x-k8s.io/job-uid") == uid
                ),
                None,
            )
            if workload is None:
                workload = self._create(wl_rt, ns, self._workload_for(rt, obj, queue))
            active = (workload.get("spec") or {}).get("active", True)
            admitted = self._true(workload, "Admitted")
            ts = self._ts()
            if active and not admitted:
                blocker = self._kueue_blocker(ns, queue)

                def wait_or_admit(w: dict, blocker: str | None = blocker) -> None:
                    conds = w.setdefault("status", {}).setdefault("conditions", [])
                    if blocker:
                        _set_condition(conds, "QuotaReserved", "False", "Pending", blocker, ts)
                        return
                    _set_condition(conds, "QuotaReserved", "True", "QuotaReserved", "", ts)
                    _set_condition(conds, "Admitted", "True", "Admitted", "", ts)
                    w["status"]["conditions"] = [c for c in conds if c["type"] != "Evicted"]

                workload = self._modify(wl_rt, workload, wait_or_admit)
                if not blocker:
                    self._modify(rt, obj, lambda o: o["spec"].update(suspend=False))
            elif not active and admitted:

                def evict(w: dict) -> None:
                    conds = w.setdefault("status", {}).setdefault("conditions", [])
                    conds[:] = [c for c in conds if c["type"] not in ("Admitted", "QuotaReserved")]
                    _set_condition(
                        conds, "Evicted", "True", "Deactivated", "The workload is deactivated", ts
                    )

                self._modify(wl_rt, workload, evict)
                self._modify(rt, obj, lambda o: o["spec"].update(suspend=True))

    def _workload_for(self, rt: ResourceType, obj: dict, queue: str) -> dict:
        meta, spec = obj["metadata"], obj.get("spec") or {}
        if rt.kind == "JobSet":
            pod_sets = [
                {
                    "name": rj["name"],
                    "count": int(rj.get("replicas", 1))
                    * int((rj.get("template") or {}).get("spec", {}).get("parallelism", 1)),
                }
                for rj in spec.get("replicatedJobs") or []
            ]
        else:
            pod_sets = [{"name": "main", "count": int(spec.get("parallelism", 1))}]
        return {
            "metadata": {
                "name": f"{rt.kind.lower()}-{meta['name']}-{meta['uid'][:5]}",
                "labels": {"kueue.x-k8s.io/job-uid": meta["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": rt.api_version,
                        "kind": rt.kind,
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": {"queueName": queue, "active": True, "podSets": pod_sets},
        }

    def _kueue_blocker(self, ns: str, queue: str) -> str | None:
        local = self._get(self._by_key["localqueues.kueue.x-k8s.io"], ns, queue)
        if local is None:
            return f"LocalQueue {queue} doesn't exist"
        cluster_queue = (local.get("spec") or {}).get("clusterQueue", "")
        if self._get(self._by_key["clusterqueues.kueue.x-k8s.io"], None, cluster_queue) is None:
            return f"ClusterQueue {cluster_queue} doesn't exist"
        return None if self.kueue_admits else self.kueue_hold_message

    def _jobset_pass(self) -> None:
        js_rt = self._by_key.get("jobsets.jobset.x-k8s.io")
        if js_rt is None:
            return
        jobs_rt = self._by_key["jobs.batch"]
        for jobset in self._objects(js_rt):
            meta, spec = jobset["metadata"], jobset.get("spec") or {}
            if meta.get("deletionTimestamp"):
                continue
            ns, suspend, done = meta["namespace"], bool(spec.get("suspend")), self._finished(jobset)
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
            if any(self._true(c, "Failed") for c in children):
                self._modify(
                    js_rt,
                    jobset,
                    lambda o: _set_condition(
                        o.setdefault("status", {}).setdefault("conditions", []),
                        "Failed",
                        "True",
                        "FailedJobs",
                        "a Job failed",
                        ts,
                    ),
                )
            elif len(children) == expected and all(self._true(c, "Complete") for c in children):
                self._modify(
                    js_rt,
                    jobset,
                    lambda o: _set_condition(
                        o.setdefault("status", {}).setdefault("conditions", []),
                        "Completed",
                        "True",
                        "AllJobsCompleted",
                        "jobset completed",
                        ts,
                    ),
                )

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
            book = self._books.setdefault(uid, _JobBook())
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
                if phase not in _TERMINAL:
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
            active = [p for p in pods if p["status"].get("phase") not in _TERMINAL]

            def kill(pods_: list[dict]) -> None:
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
                    _set_condition(conds, "FailureTarget", "True", reason, msg, ts)
                    _set_condition(conds, "Failed", "True", reason, msg, ts)
                    self._emit(jrt, job, "Warning", reason, msg)
                elif complete:
                    kill(active)
                    active = []
                    msg = "Reached expected number of succeeded pods"
                    _set_condition(
                        conds, "SuccessCriteriaMet", "True", "CompletionsReached", msg, ts
                    )
                    _set_condition(conds, "Complete", "True", "CompletionsReached", msg, ts)
                    new_status["completionTime"] = ts
                    self._emit(jrt, job, "Normal", "Completed", "Job completed")
                elif spec.get("suspend"):
                    if active:
                        kill(active)
                        active = []
                    was = _condition(job, "Suspended")
                    if not was or was["status"] != "True":
                        _set_condition(
                            conds, "Suspended", "True", "JobSuspended", "Job suspended", ts
                        )
                        self._emit(jrt, job, "Normal", "Suspended", "Job suspended")
                    new_status.pop("startTime", None)
                else:
                    was = _condition(job, "Suspended")
                    if was and was["status"] == "True":
                        _set_condition(conds, "Suspended", "False", "JobResumed", "Job resumed", ts)
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
                1 for p in active if (_condition(p, "Ready") or {}).get("status") == "True"
            )
            if indexed and book.ok_idx:
                new_status["completedIndexes"] = _compress_indexes(book.ok_idx)
            new_status.setdefault("uncountedTerminatedPods", {})
            current = self._get(jrt, ns, job["metadata"]["name"])
            if current is not None and current["metadata"]["uid"] == uid:

                def set_status(j: dict, st: dict = new_status) -> None:
                    j["status"] = st

                self._modify(jrt, current, set_status)

    def _create_job_pods(self, job: dict, book: _JobBook, active: list[dict]) -> list[dict]:
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

    # ---- scheduler + kubelet

    @staticmethod
    def _tolerated(taint: dict, tolerations: list[dict]) -> bool:
        for t in tolerations:
            if t.get("effect") and t["effect"] != taint.get("effect"):
                continue
            if t.get("operator") == "Exists":
                if not t.get("key") or t["key"] == taint.get("key"):
                    return True
            elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
                taint.get("value") or ""
            ):
                return True
        return False

    @staticmethod
    def _affinity_ok(pod_spec: dict, labels: dict) -> bool:
        for k, v in (pod_spec.get("nodeSelector") or {}).items():
            if labels.get(k) != v:
                return False
        req = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = req.get("nodeSelectorTerms") or []
        if not terms:
            return True

        def expr_ok(e: dict) -> bool:
            k, op, vals = e.get("key"), e.get("operator"), e.get("values") or []
            v = labels.get(k)
            if op == "In":
                return v in vals
            if op == "NotIn":
                return v not in vals
            if op == "Exists":
                return k in labels
            if op == "DoesNotExist":
                return k not in labels
            if op in ("Gt", "Lt") and v is not None and vals:
                try:
                    return int(v) > int(vals[0]) if op == "Gt" else int(v) < int(vals[0])
                except ValueError:
                    return False
            return False

        return any(all(expr_ok(e) for e in t.get("matchExpressions") or []) for t in terms)

    def _node_rejects(
        self, node: dict, pod: dict, req: dict[str, Fraction], used: Counter, npods: int
    ) -> str | None:
        nspec, nstatus = node.get("spec") or {}, node.get("status") or {}
        pspec = pod.get("spec") or {}
        if nspec.get("unschedulable"):
            return "node(s) were unschedulable"
        ready = next((c for c in nstatus.get("conditions") or [] if c["type"] == "Ready"), None)
        if ready is None or ready.get("status") != "True":
            return "node(s) had untolerated taint {node.kubernetes.io/not-ready: }"
        for taint in nspec.get("taints") or []:
            if taint.get("effect") in ("NoSchedule", "NoExecute") and not self._tolerated(
                taint, pspec.get("tolerations") or []
            ):
                return (
                    f"node(s) had untolerated taint {{{taint.get('key')}: "
                    f"{taint.get('value') or ''}}}"
                )
        if not self._affinity_ok(pspec, node["metadata"].get("labels") or {}):
            return "node(s) didn't match Pod's node affinity/selector"
        alloc = nstatus.get("allocatable") or {}
        if "pods" in alloc and npods + 1 > parse_quantity(alloc["pods"]):
            return "Too many pods"
        for res, amount in sorted(req.items()):
            if amount <= 0:
                continue
            if res not in alloc:
                if res in ("cpu", "memory", "ephemeral-storage"):
                    continue
                return f"Insufficient {res}"
            if used[res] + amount > parse_quantity(alloc[res]):
                return f"Insufficient {res}"
        return None

    def _pods_pass(self) -> None:
        prt, nrt = self._by_key["pods"], self._by_key["nodes"]
        now, ts = self._now(), self._ts()
        nodes = self._objects(nrt)
        used: dict[str, Counter] = {n["metadata"]["name"]: Counter() for n in nodes}
        counts: Counter = Counter()
        pods = self._objects(prt)
        for p in pods:
            node = (p.get("spec") or {}).get("nodeName")
            if node in used and p["status"].get("phase") not in _TERMINAL:
                used[node].update(self._pod_resources(p))
                counts[node] += 1
        pending = sorted(
            (p for p in pods if p["status"].get("phase") == "Pending"),
            key=lambda p: (
                p["metadata"]["creationTimestamp"],
                int(p["metadata"]["resourceVersion"]),
            ),
        )
        for p in pending:
            uid = p["metadata"]["uid"]
            spec = p.get("spec") or {}
            if spec.get("nodeName"):
                bound = self._bound_at.setdefault(uid, now)
                if now >= bound + self.pod_start_delay:
                    self._start_pod(p)
                continue
            if spec.get("schedulingGates"):

                def gated(q: dict) -> None:
                    _set_condition(
                        q["status"].setdefault("conditions", []),
                        "PodScheduled",
                        "False",
                        "SchedulingGated",
                        "Scheduling is blocked due to non-empty scheduling gates",
                        ts,
                    )

                self._modify(prt, p, gated)
                continue
            req = self._pod_resources(p)
            reasons: Counter = Counter()
            chosen = None
            for n in nodes:
                nname = n["metadata"]["name"]
                why = self._node_rejects(n, p, req, used[nname], counts[nname])
                if why is None:
                    chosen = n
                    break
                reasons[why] += 1
            if chosen is not None:
                nname = chosen["metadata"]["name"]
                used[nname].update(req)
                counts[nname] += 1
                self._bound_at[uid] = now
                self._sched_msgs.pop(uid, None)

                def bind(q: dict, nname: str = nname) -> None:
                    q["spec"]["nodeName"] = nname
                    _set_condition(
                        q["status"].setdefault("conditions", []), "PodScheduled", "True", "", "", ts
                    )

                bound = self._modify(prt, p, bind)
                self._emit(
                    prt,
                    bound,
                    "Normal",
                    "Scheduled",
                    f"Successfully assigned {p['metadata']['namespace']}/{p['metadata']['name']} "
                    f"to {nname}",
                    "default-scheduler",
                )
                continue
            if nodes:
                detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
                msg = f"0/{len(nodes)} nodes are available: {detail}."
            else:
                msg = "no nodes available to schedule pods"

            def unsched(q: dict, msg: str = msg) -> None:
                _set_condition(
                    q["status"].setdefault("conditions", []),
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                    msg,
                    ts,
                )

            p2 = self._modify(prt, p, unsched)
            if self._sched_msgs.get(uid) != msg:
                self._sched_msgs[uid] = msg
                self._emit(prt, p2, "Warning", "FailedScheduling", msg, "default-scheduler")
        for p in self._objects(prt):
            run = self._pod_runs.get(p["metadata"]["uid"])
            if run and p["status"].get("phase") == "Running" and now >= run[0]:
                code = run[1]
                self._terminate(
                    p,
                    "Succeeded" if code == 0 else "Failed",
                    code,
                    "Completed" if code == 0 else "Error",
                )

    def _start_pod(self, pod: dict) -> None:
        prt, nrt = self._by_key["pods"], self._by_key["nodes"]
        ts = self._ts()
        node = self._get(nrt, None, pod["spec"]["nodeName"]) or {}
        host_ip = next(
            (
                a["address"]
                for a in (node.get("status") or {}).get("addresses") or []
                if a["type"] == "InternalIP"
            ),
            "10.0.0.1",
        )
        n = next(self._ips)

        def fn(q: dict) -> None:
            st = q["status"]
            st.update(
                phase="Running",
                hostIP=host_ip,
                hostIPs=[{"ip": host_ip}],
                podIP=f"10.244.{n // 250 % 250}.{n % 250 + 1}",
                podIPs=[{"ip": f"10.244.{n // 250 % 250}.{n % 250 + 1}"}],
                startTime=ts,
            )
            conds = st.setdefault("conditions", [])
            for ctype in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady"):
                _set_condition(conds, ctype, "True", "", "", ts)
            st["containerStatuses"] = [
                {
                    "name": c["name"],
                    "image": c.get("image"),
                    "imageID": f"{c.get('image')}@sha256:{'0' * 64}",
                    "containerID": f"containerd://{uuid.uuid4().hex}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": ts}},
                }
                for c in q["spec"]["containers"]
            ]

        started = self._modify(prt, pod, fn)
        self._emit(
            prt,
            started,
            "Normal",
            "Started",
            f"Started container {pod['spec']['containers'][0]['name']}",
            "kubelet",
        )
        if self.pod_script is not None:
            run = self.pod_script(copy.deepcopy(started))
            if run is not None:
                m = started["metadata"]
                for line in run.logs:
                    self.append_log(m["namespace"], m["name"], line)
                if run.duration is not None:
                    self._pod_runs[m["uid"]] = (self._now() + run.duration, run.exit_code)

    def _quota_pass(self) -> None:
        qrt = self._by_key["resourcequotas"]
        for q in self._objects(qrt):
            hard = (q.get("spec") or {}).get("hard") or {}
            usage = self._quota_usage(q["metadata"]["namespace"], hard)
            want = {
                "hard": dict(hard),
                "used": {k: format_quantity(v) for k, v in usage.items()},
            }
            if q.get("status") != want:

                def fn(o: dict, want: dict = want) -> None:
                    o["status"] = want

                self._modify(qrt, q, fn)


# --------------------------------------------------------------------------- fixture
