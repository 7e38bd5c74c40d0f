"""Status conditions (``status.conditions``) and the phases that end a pod."""

from __future__ import annotations

TERMINAL_PHASES = ("Succeeded", "Failed")


def set_condition(
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


def set_readiness(pod: dict, ready: bool, ts: str) -> None:
    """Set a running pod's Ready and ContainersReady conditions, as the kubelet does
    from its containers' readiness."""
    conds = pod["status"].setdefault("conditions", [])
    unready = [c["name"] for c in pod["spec"]["containers"]]
    message = "" if ready else f"containers with unready status: [{' '.join(unready)}]"
    for ctype in ("Ready", "ContainersReady"):
        reason = "" if ready else "ContainersNotReady"
        set_condition(conds, ctype, "True" if ready else "False", reason, message, ts)


def get_condition(obj: dict, ctype: str) -> dict | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return c
    return None


def is_true(obj: dict, ctype: str) -> bool:
    """Whether ``obj`` has condition ``ctype`` with status "True"."""
    cond = get_condition(obj, ctype)
    return bool(cond and cond.get("status") == "True")


def is_finished(obj: dict) -> bool:
    """Whether a Job or JobSet has ended (Complete, Completed or Failed)."""
    return any(is_true(obj, c) for c in ("Complete", "Completed", "Failed"))
