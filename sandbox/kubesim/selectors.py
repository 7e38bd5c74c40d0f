"""Label and field selectors (``labelSelector``, ``fieldSelector``, metav1.LabelSelector)
parsed into predicates."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sandbox.kubesim.errors import ApiError

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


def label_selector_string(sel: dict | None) -> str:
    """A metav1.LabelSelector in the query syntax, as a Scale's ``status.selector``."""
    parts = [f"{k}={v}" for k, v in sorted(((sel or {}).get("matchLabels") or {}).items())]
    for expr in (sel or {}).get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        values = ",".join(sorted(expr.get("values") or []))
        if op in ("In", "NotIn"):
            parts.append(f"{key} {op.lower()} ({values})")
        elif op == "Exists":
            parts.append(str(key))
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return ",".join(parts)
