"""A local job's checkpoint folder: with a folder store, the job's own prefix
`<tenant>/<job>/` is created for the uid the job runs as and, in the bubblewrap sandbox,
bind-mounted at CHECKPOINT_MOUNT: the only part of the store the job can see. With an
S3 store there is nothing to mount; the job reaches its prefix over the network."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from jobs.checkpoints.store import checkpoint_store, job_checkpoint_environment, job_prefix

if TYPE_CHECKING:
    from jobs.models import Job

# Where a sandboxed job sees its checkpoint folder.
CHECKPOINT_MOUNT = "/checkpoints"


def checkpoint_folder(job: Job, owner: tuple[int, int] | None) -> Path | None:
    """The job's folder in a folder store (made, owned by the job's uid), else None."""
    store = checkpoint_store()
    folder = store.local_folder(job_prefix(tenant_id=job.tenant_id, job_id=job.pk))
    if folder is None:
        return None
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Job users pass through the store's root and their tenant's folder, never list them.
    for parent in (folder.parent, folder.parent.parent):
        os.chmod(parent, 0o711)  # noqa: S103
    if owner and owner[0] != os.geteuid():
        os.chown(folder, owner[0], owner[1], follow_symlinks=False)
    return folder


def checkpoint_environment(job: Job, *, sandboxed: bool) -> dict[str, str]:
    """GPUGEEK_CHECKPOINT_URL (the mount inside the sandbox, the folder outside it, or
    the S3 prefix) and GPUGEEK_RESUME_FROM."""
    mounted = sandboxed and checkpoint_store().local_folder("") is not None
    return job_checkpoint_environment(
        tenant_id=job.tenant_id,
        job_id=job.pk,
        resume_from=job.resume_from,
        mounted_at=CHECKPOINT_MOUNT if mounted else None,
    )
