"""The SDK's checkpoint helper against the live console (uvicorn on the test database):
`checkpoint.save` posts the job's `checkpoint` event with the job's own token, and the
console records the checkpoint and prunes the older ones at once."""

from __future__ import annotations

import pytest
from gpugeek import checkpoint

from jobs.backends.local_checkpoints import checkpoint_environment
from jobs.checkpoints.store import checkpoint_store
from jobs.models import Job, JobStatus
from jobs.services.checkpoints import job_store_prefix
from tests.factories import JobFactory
from tests.jobs_helpers import advance_to
from tests.servers import asgi_server  # noqa: F401


@pytest.fixture
def shared_store(tmp_path, monkeypatch, settings):
    """A folder store both this process and the server (started after) use."""
    url = f"file://{tmp_path / 'store'}"
    monkeypatch.setenv("CHECKPOINT_STORE_URL", url)
    monkeypatch.setenv("CHECKPOINT_KEEP_LAST", "2")
    settings.CHECKPOINT_STORE_URL = url
    return url


def test_save_posts_the_event_and_the_console_records_and_prunes(
    shared_store,
    asgi_server,  # noqa: F811
    settings,
    monkeypatch,
    tmp_path,
):
    job = JobFactory()
    advance_to(job, JobStatus.RUNNING)
    settings.CONSOLE_URL_FOR_JOBS = asgi_server.url
    for name, value in checkpoint_environment(job, sandboxed=False).items():
        monkeypatch.setenv(name, value)  # what the job is handed, nothing else
    monkeypatch.delenv("GPUGEEK_TOKEN", raising=False)
    files = tmp_path / "ckpt"
    files.mkdir()
    for step in (10, 20, 30):
        (files / "model.pt").write_bytes(b"w" * step)
        checkpoint.save(files, step=step)
        job.refresh_from_db()
        # Recorded by the server on the event, before save() returned.
        assert job.last_checkpoint_step == step
        kept = [c.step for c in checkpoint_store().checkpoints(job_store_prefix(job))]
        assert kept == ([step - 10, step] if step > 10 else [10])
    assert checkpoint.notify(step=30) is True


def test_a_job_can_not_post_for_another_job(
    shared_store,
    asgi_server,  # noqa: F811
    settings,
    monkeypatch,
):
    mine, theirs = JobFactory(), JobFactory()
    advance_to(theirs, JobStatus.RUNNING)
    settings.CONSOLE_URL_FOR_JOBS = asgi_server.url
    env = checkpoint_environment(mine, sandboxed=False)
    monkeypatch.setenv("GPUGEEK_CHECKPOINT_TOKEN", env["GPUGEEK_CHECKPOINT_TOKEN"])
    monkeypatch.setenv(
        "GPUGEEK_CHECKPOINT_NOTIFY_URL",
        env["GPUGEEK_CHECKPOINT_NOTIFY_URL"].replace(f"/{mine.pk}/", f"/{theirs.pk}/"),
    )
    assert checkpoint.notify(step=1) is False
    assert Job.objects.get(pk=theirs.pk).last_checkpoint_step is None
