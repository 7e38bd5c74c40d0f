"""What jobs leave on a backend's own disk (a local job's work and run directories):
removed when the job is deleted, and once it ended LOCAL_JOB_RETENTION_HOURS ago (its log
stays readable from the archive)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from jobs.backends import configured_backends, get_backend
from jobs.models import FINISHED, Job, JobLogArchive


def job_files_discard(*, backend_name: str, job_ids: list[int]) -> None:
    """Remove deleted jobs' files on their backend, output included."""
    get_backend(backend_name).discard(job_ids, logs=True)


def jobs_files_prune(*, now: datetime) -> int:
    """Remove the work files of jobs that ended before the retention period (their output
    too once the log is archived) and everything of jobs that no longer exist. Returns
    how many jobs' files were touched."""
    cutoff = now - timedelta(hours=settings.LOCAL_JOB_RETENTION_HOURS)
    touched = 0
    for backend in configured_backends():
        stored = backend.stored_job_ids()
        if not stored:
            continue
        rows = dict(Job.objects.filter(pk__in=stored).values_list("pk", "finished_at").iterator())
        gone = sorted(stored - rows.keys())
        expired = sorted(
            pk
            for pk, finished_at in rows.items()
            if finished_at is not None and finished_at < cutoff
        )
        expired = list(
            Job.objects.filter(pk__in=expired, status__in=FINISHED).values_list("pk", flat=True)
        )
        archived = set(
            JobLogArchive.objects.filter(job_id__in=expired).values_list("job_id", flat=True)
        )
        backend.discard(gone, logs=True)
        backend.discard([pk for pk in expired if pk in archived], logs=True)
        backend.discard([pk for pk in expired if pk not in archived], logs=False)
        touched += len(gone) + len(expired)
    return touched
