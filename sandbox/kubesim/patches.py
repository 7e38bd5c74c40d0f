"""PATCH bodies: JSON merge patch (RFC 7386), strategic merge patch (merge patch plus
list merging by the well-known merge keys) and JSON patch (RFC 6902)."""

from __future__ import annotations

import copy
from typing import Any

from sandbox.kubesim.errors import ApiError

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
