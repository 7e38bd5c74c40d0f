"""The job's checkpoints in the API (`GET /api/v1/jobs/<id>/checkpoints`) and on the job
page: complete ones only, newest first, where each later start resumed from; another
organisation's job is a 404."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from django.urls import reverse

from jobs.backends.base import Observation
from jobs.backends.local_checkpoints import checkpoint_environment
from jobs.checkpoints.store import MANIFEST_NAME
from jobs.models import Job, JobStatus
from jobs.services.checkpoints import job_resume_prepare
from jobs.services.observe import job_apply_observation
from tests.conftest import signed_in_client, token_client
from tests.factories import JobFactory
from tests.jobs_helpers import advance_to

SRC = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from gpugeek import checkpoint as sdk  # noqa: E402


@pytest.fixture(autouse=True)
def folder_store(settings, tmp_path):
    settings.CHECKPOINT_STORE_URL = f"file://{tmp_path / 'store'}"


def save(job, tmp_path: Path, step: int) -> None:
    folder = tmp_path / f"files-{step}"
    folder.mkdir()
    (folder / "model.pt").write_bytes(b"x" * 2048)
    url = checkpoint_environment(job, sandboxed=False)["GPUGEEK_CHECKPOINT_URL"]
    sdk.save(folder, step=step, url=url)


def api_url(job) -> str:
    return f"/api/v1/jobs/{job.pk}/checkpoints"


@pytest.mark.django_db
def test_the_api_lists_complete_checkpoints_and_resumes(world, catalog, tmp_path):
    job = JobFactory(tenant=world.tenant)
    api = token_client(world.member, world.tenant)
    empty = api.get(api_url(job))
    assert empty.status_code == 200, empty.content
    assert empty.json() == {"checkpoints": [], "resumes": [], "unavailable": ""}
    advance_to(job, JobStatus.RUNNING)
    save(job, tmp_path, 100)
    save(job, tmp_path, 200)
    (tmp_path / "store" / str(job.tenant_id) / str(job.pk) / "300").mkdir()
    (tmp_path / "store" / str(job.tenant_id) / str(job.pk) / "300" / "model.pt").write_bytes(b"x")
    job = job_apply_observation(job=job, observation=Observation(phase="preempted"))
    job_resume_prepare(job=job, start=0)
    body = api.get(api_url(job)).json()
    assert [c["step"] for c in body["checkpoints"]] == [200, 100]
    newest = body["checkpoints"][0]
    assert newest["size_bytes"] == 2048
    assert newest["files"] == [{"path": "model.pt", "size": 2048}]
    assert newest["manifest_url"].endswith(f"/{job.tenant_id}/{job.pk}/200/{MANIFEST_NAME}")
    [resume] = body["resumes"]
    assert resume["attempt"] == 2 and resume["step"] == 200
    assert resume["lost_seconds"] >= 0


@pytest.mark.django_db
def test_another_tenants_checkpoints_are_404(world, other_world, catalog, tmp_path):
    theirs = JobFactory(tenant=other_world.tenant)
    save(theirs, tmp_path, 1)
    assert token_client(world.member, world.tenant).get(api_url(theirs)).status_code == 404
    page = signed_in_client(world.member, world.tenant).get(
        reverse("jobs:detail", args=[theirs.pk])
    )
    assert page.status_code == 404


@pytest.mark.django_db
def test_the_job_page_shows_checkpoints_and_where_attempts_resumed(world, catalog, tmp_path):
    job = JobFactory(tenant=world.tenant, created_by=world.member)
    client = signed_in_client(world.member, world.tenant)
    url = reverse("jobs:detail", args=[job.pk])
    page = client.get(url).content.decode()
    assert 'data-testid="checkpoints"' in page
    assert "No complete checkpoint yet" in page
    assert "Clone from checkpoint" not in page  # nothing to continue from yet
    advance_to(job, JobStatus.RUNNING)
    save(job, tmp_path, 42)
    job = job_apply_observation(job=job, observation=Observation(phase="preempted"))
    job_resume_prepare(job=job, start=0)
    page = client.get(url).content.decode()
    assert "No complete checkpoint yet" not in page
    assert "2.0\xa0KB" in page  # a human size
    assert "Attempt 2: resumed from step 42, lost 0.0 min" in page
    assert "Clone from checkpoint (step 42)" in page
    assert "resumed from checkpoint step 42" in page  # the timeline says it too
    partial = client.get(url, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-checkpoints")
    assert partial.content.decode().lstrip().startswith('<section id="job-checkpoints"')


@pytest.mark.django_db
def test_clone_from_checkpoint_asks_first_then_launches_from_it(world, catalog, tmp_path):
    job = JobFactory(tenant=world.tenant, created_by=world.member)
    client = signed_in_client(world.member, world.tenant)
    url = reverse("jobs:clone", args=[job.pk]) + "?from_checkpoint=1"
    refused = client.post(url)  # nothing to continue from yet: said, nothing launched
    assert refused.status_code == 302
    assert Job.objects.count() == 1
    save(job, tmp_path, 9)
    asked = client.get(url).content.decode()
    assert "from its checkpoint?" in asked
    assert "continues from this job&#x27;s latest complete checkpoint" in asked
    launched = client.post(url)
    assert launched.status_code == 302
    clone = Job.objects.exclude(pk=job.pk).get()
    assert clone.checkpoint_source_id == job.pk
    assert launched["Location"] == reverse("jobs:detail", args=[clone.pk])
