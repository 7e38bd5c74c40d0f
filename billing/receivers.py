"""What billing does when the rooms below it announce a change (connected in
`BillingConfig.ready`)."""

from __future__ import annotations

from billing.metering.tick import release_held_usage


def job_deleting_keep_usage(sender, job_ids: list[int], **kwargs) -> None:
    """A deleted job's usage stays in the job rollups: move what its meter holds there
    first (this waits for any metering tick to end, and holds off the next)."""
    release_held_usage(job_ids)
