"""What host jobs keep on this host's disk, besides their processes: each job's run
directory (the supervisor's: pid, exit code, output), its work directory (its own), and
the files the console publishes to it while it runs (ComputeBackend.publish_file): a
folder per job beside the work dirs, owned by the console, that the sandbox mounts
read-only at PUBLISHED_MOUNT. The console writes, the job only reads (a dev
environment's sshd reads the keys of who may use it now: environments.services.keys)."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.models import Job

# Under the work root: the console's files for each job.
PUBLISHED_DIR = "published"


class LocalFiles:
    """The local backend's `stored_job_ids`, `discard` and `publish_file`
    (ComputeBackend's interface)."""

    data_dir: Path

    def work_root(self) -> Path:
        raise NotImplementedError

    def _owner(self, job: Job) -> tuple[int, int] | None:
        raise NotImplementedError

    def stored_job_ids(self) -> set[int]:
        """Jobs with a run or work directory on this host."""
        ids: set[int] = set()
        for root in (self.data_dir / "jobs", self.work_root()):
            with contextlib.suppress(OSError):
                ids.update(int(entry.name) for entry in os.scandir(root) if entry.name.isdigit())
        return ids

    def discard(self, job_ids: list[int], *, logs: bool = True) -> None:
        """Remove the jobs' work dirs and published files, and with `logs` their run dirs
        (output and control files: the console has archived the log, or the job is gone)."""
        for job_id in job_ids:
            for root in (self.work_root(), self.work_root() / PUBLISHED_DIR):
                shutil.rmtree(root / str(int(job_id)), ignore_errors=True)
            if logs:
                shutil.rmtree(self.data_dir / "jobs" / str(int(job_id)), ignore_errors=True)

    def published_dir(self, job: Job) -> Path:
        """The job's folder of published files (made): the job's user passes through to
        it (the sandbox mounts it as that user) but owns nothing on the way."""
        root = self.work_root()
        root.mkdir(parents=True, exist_ok=True)
        path = root / PUBLISHED_DIR / str(int(job.pk))
        path.mkdir(parents=True, exist_ok=True)
        # Passed through, never listed; the job's own folder readable by its organisation's
        # jobs only (its group), where jobs have their own ids.
        os.chmod(root, 0o711)  # noqa: S103
        os.chmod(path.parent, 0o711)  # noqa: S103
        owner = self._owner(job)
        if owner and owner[0] != os.geteuid():
            os.chown(path, os.geteuid(), owner[1], follow_symlinks=False)
            os.chmod(path, 0o750)  # noqa: S103
        else:
            os.chmod(path, 0o755)  # noqa: S103
        return path

    def publish_file(self, job: Job, name: str, text: str) -> bool:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"not a file name: {name!r}")
        folder = self.published_dir(job)
        partial = folder / f".{name}.partial"
        partial.write_text(text)
        os.chmod(partial, 0o644)
        os.replace(partial, folder / name)  # whole: sshd reads the old file or the new
        return True
