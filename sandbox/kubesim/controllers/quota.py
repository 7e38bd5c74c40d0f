"""The ResourceQuota controller: keeps each quota's ``status.used`` current."""

from __future__ import annotations

from sandbox.kubesim.admission import Admission
from sandbox.kubesim.resources import format_quantity


class QuotaController(Admission):
    """One pass over every ResourceQuota."""

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
