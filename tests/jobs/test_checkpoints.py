"""The checkpoint store and protocol, through the real stores only: a folder, and an
S3-compatible server (moto's server mode over HTTP, started here) through boto3.

A checkpoint counts only when its manifest, written last, lists files that exist with
their sizes; pruning keeps the newest; a job's environment never points outside its
own prefix; a later attempt continues from the latest complete checkpoint."""

from __future__ import annotations

import json
import socket
import sys
import urllib.request
from datetime import timedelta
from pathlib import Path

import boto3
import pytest
from django.utils import timezone
from moto.server import ThreadedMotoServer

from jobs.backends.base import Observation
from jobs.backends.local_checkpoints import CHECKPOINT_MOUNT, checkpoint_environment
from jobs.checkpoints.store import MANIFEST_NAME, checkpoint_store, job_prefix
from jobs.models import JobResume, JobStatus
from jobs.selectors import job_checkpoints
from jobs.services import job_dispatch
from jobs.services.checkpoints import (
    job_checkpoints_prune,
    job_resume_prepare,
    job_store_prefix,
)
from jobs.services.observe import job_apply_observation
from jobs.tasks import jobs_checkpoints_prune_task
from tests.factories import JobFactory
from tests.jobs_helpers import advance_to

SRC = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from gpugeek import checkpoint as sdk  # noqa: E402

BUCKET = "gpugeek-checkpoints"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(params=["file", "s3"])
def store_kind(request, settings, tmp_path, monkeypatch):
    """The installation's store, of each kind; the SDK sees what a job would (AWS_*)."""
    if request.param == "file":
        settings.CHECKPOINT_STORE_URL = f"file://{tmp_path / 'store'}"
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        bucket = f"{BUCKET}-{_free_port()}"  # a bucket per test: nothing left between tests
        settings.CHECKPOINT_STORE_URL = f"s3://{bucket}/base"
        settings.CHECKPOINT_STORE_ENDPOINT = endpoint
        settings.CHECKPOINT_STORE_REGION = "us-east-1"
        settings.CHECKPOINT_STORE_ACCESS_KEY_ID = "console-key"
        settings.CHECKPOINT_STORE_SECRET_ACCESS_KEY = "console-secret"
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="console-key",
            aws_secret_access_key="console-secret",
        ).create_bucket(Bucket=bucket)
        for name, value in {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "console-key",
            "AWS_SECRET_ACCESS_KEY": "console-secret",
        }.items():
            monkeypatch.setenv(name, value)
    return request.param


def job_url(job) -> str:
    """The URL a job is handed (outside a sandbox)."""
    return checkpoint_environment(job, sandboxed=False)["GPUGEEK_CHECKPOINT_URL"]


def save(job, tmp_path: Path, step: int, *, size: int = 10) -> str:
    files = tmp_path / f"ckpt-{step}"
    files.mkdir(exist_ok=True)
    (files / "model.pt").write_bytes(b"m" * size)
    (files / "opt" / "state.bin").parent.mkdir(exist_ok=True)
    (files / "opt" / "state.bin").write_bytes(b"o" * (size + 1))
    return sdk.save(files, step=step, metrics={"loss": 1.0 / (step + 1)}, url=job_url(job))


def put_raw(job, key: str, data: bytes) -> None:
    """Write one object under the job's prefix as a crashed uploader would leave it."""
    store = checkpoint_store()
    if folder := store.local_folder(job_store_prefix(job)):
        (folder / key).parent.mkdir(parents=True, exist_ok=True)
        (folder / key).write_bytes(data)
    else:
        store.client.put_object(  # type: ignore[attr-defined]
            Bucket=store.bucket,  # type: ignore[attr-defined]
            Key=store.base + job_store_prefix(job) + key,  # type: ignore[attr-defined]
            Body=data,
        )


@pytest.mark.django_db
def test_saved_checkpoints_are_found_by_console_and_sdk(store_kind, tmp_path):
    job = JobFactory()
    for step in (5, 10, 15):
        url = save(job, tmp_path, step)
        assert url.endswith(f"/{step}/{MANIFEST_NAME}")
    found = checkpoint_store().checkpoints(job_store_prefix(job))
    assert [c.step for c in found] == [5, 10, 15]
    assert found[-1].size_bytes == 10 + 11
    assert {f.path for f in found[-1].files} == {"model.pt", "opt/state.bin"}
    assert found[-1].metrics == {"loss": 1.0 / 16}
    latest = sdk.latest(job_url(job))
    assert latest is not None and latest.step == 15
    fetched = latest.fetch(tmp_path / "fetched")
    assert (fetched / "opt" / "state.bin").read_bytes() == b"o" * 11


@pytest.mark.django_db
def test_a_partial_upload_is_never_offered(store_kind, tmp_path):
    job = JobFactory()
    save(job, tmp_path, 5)
    # Files without a manifest (cut off before the manifest was written).
    put_raw(job, "20/model.pt", b"partial")

    # A manifest listing a file that isn't there, and one with the wrong size.
    def manifest(step: int, path: str, size: int) -> bytes:
        files = [{"path": path, "size": size}]
        return json.dumps(
            {"step": step, "time": timezone.now().isoformat(), "files": files}
        ).encode()

    put_raw(job, f"30/{MANIFEST_NAME}", manifest(30, "model.pt", 3))
    put_raw(job, "40/model.pt", b"12")
    put_raw(job, f"40/{MANIFEST_NAME}", manifest(40, "model.pt", 3))
    # A manifest whose file would lie outside its folder, and one that isn't JSON.
    put_raw(job, f"50/{MANIFEST_NAME}", manifest(50, "../5/model.pt", 10))
    put_raw(job, f"60/{MANIFEST_NAME}", b"{not json")
    assert [c.step for c in checkpoint_store().checkpoints(job_store_prefix(job))] == [5]
    assert sdk.latest(job_url(job)).step == 5


@pytest.mark.django_db
def test_pruning_keeps_the_newest_and_drops_old_partials(store_kind, tmp_path):
    job = JobFactory()
    put_raw(job, "1/model.pt", b"abandoned")
    for step in (2, 4, 6, 8, 10):
        save(job, tmp_path, step)
    put_raw(job, "12/model.pt", b"uploading now")
    assert job_checkpoints_prune(job=job, keep_last=3) == [1, 2, 4]
    store = checkpoint_store()
    assert [c.step for c in store.checkpoints(job_store_prefix(job))] == [6, 8, 10]
    keys = store.sizes(job_store_prefix(job))
    assert not any(key.startswith(("1/", "2/", "4/")) for key in keys)
    assert "12/model.pt" in keys  # a newer upload in progress is left alone
    assert job_checkpoints_prune(job=job, keep_last=3) == []


@pytest.mark.django_db
def test_pruning_never_deletes_the_checkpoint_being_resumed_from(store_kind, tmp_path):
    job = JobFactory()
    for step in (1, 2, 3):
        save(job, tmp_path, step)
    job.resume_from = f"1/{MANIFEST_NAME}"
    assert job_checkpoints_prune(job=job, keep_last=1) == [2]
    assert [c.step for c in checkpoint_store().checkpoints(job_store_prefix(job))] == [1, 3]


@pytest.mark.django_db
def test_prefixes_are_per_tenant_and_job(store_kind, tmp_path):
    mine, theirs = JobFactory(), JobFactory()
    assert mine.tenant_id != theirs.tenant_id
    save(theirs, tmp_path, 7)
    assert checkpoint_store().checkpoints(job_store_prefix(mine)) == []
    env = checkpoint_environment(mine, sandboxed=False)
    url = env["GPUGEEK_CHECKPOINT_URL"]
    assert url.endswith(f"/{job_prefix(tenant_id=mine.tenant_id, job_id=mine.pk)}")
    assert sdk.latest(url) is None  # the other job's checkpoint is not under mine
    assert env["GPUGEEK_RESUME_FROM"] == ""


@pytest.mark.django_db
def test_the_job_environment_points_into_its_own_prefix_only(store_kind, tmp_path, settings):
    job = JobFactory()
    save(job, tmp_path, 3)
    job.resume_from = f"3/{MANIFEST_NAME}"
    env = checkpoint_environment(job, sandboxed=False)
    prefix = env["GPUGEEK_CHECKPOINT_URL"]
    assert env["GPUGEEK_RESUME_FROM"] == f"{prefix}3/{MANIFEST_NAME}"
    if store_kind == "file":
        sandboxed = checkpoint_environment(job, sandboxed=True)
        assert sandboxed["GPUGEEK_CHECKPOINT_URL"] == f"file://{CHECKPOINT_MOUNT}/"
        assert sandboxed["GPUGEEK_RESUME_FROM"] == f"file://{CHECKPOINT_MOUNT}/3/{MANIFEST_NAME}"
    else:
        assert prefix == f"s3://{settings.CHECKPOINT_STORE_URL[5:]}/{job.tenant_id}/{job.pk}/"
        assert env["AWS_ENDPOINT_URL"] == settings.CHECKPOINT_STORE_ENDPOINT
        assert "AWS_ACCESS_KEY_ID" not in env  # never the console's own keys
        settings.CHECKPOINT_STORE_JOB_ACCESS_KEY_ID = "job-key"
        settings.CHECKPOINT_STORE_JOB_SECRET_ACCESS_KEY = "job-secret"
        env = checkpoint_environment(job, sandboxed=False)
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("job-key", "job-secret")


@pytest.mark.django_db
def test_a_later_attempt_resumes_from_the_latest_complete_checkpoint(
    store_kind, tmp_path, world, catalog
):
    job = JobFactory(tenant=world.tenant)
    advance_to(job, JobStatus.RUNNING)
    save(job, tmp_path, 10)
    save(job, tmp_path, 20)
    put_raw(job, "30/model.pt", b"cut off by the preemption")
    job = job_apply_observation(job=job, observation=Observation(phase="preempted"))
    assert job.status == JobStatus.QUEUED and job.attempt == 2
    resume = job_resume_prepare(job=job, start=0)
    assert (resume.step, resume.manifest_key) == (20, f"20/{MANIFEST_NAME}")
    assert resume.lost_seconds is not None and 0 <= resume.lost_seconds < 60
    job.refresh_from_db()
    assert job.resume_from == f"20/{MANIFEST_NAME}"
    env = checkpoint_environment(job, sandboxed=False)
    assert env["GPUGEEK_RESUME_FROM"].endswith(f"/{job.tenant_id}/{job.pk}/20/{MANIFEST_NAME}")
    assert "resumed from checkpoint step 20" in job.events.last().reason
    # Preparing again (a redelivered dispatch) keeps the same decision, even with a newer
    # checkpoint meanwhile.
    save(job, tmp_path, 40)
    again = job_resume_prepare(job=job, start=0)
    assert again.pk == resume.pk and again.step == 20
    assert JobResume.objects.filter(job=job).count() == 1


@pytest.mark.django_db
def test_lost_work_is_the_time_from_the_checkpoint_to_the_preemption(store_kind, tmp_path):
    job = JobFactory()
    advance_to(job, JobStatus.RUNNING)
    save(job, tmp_path, 1)
    later = timezone.now() + timedelta(minutes=7)
    advance_to(job, JobStatus.PREEMPTED, at=later)
    advance_to(job, JobStatus.QUEUED, attempt=2)
    job.refresh_from_db()
    resume = job_resume_prepare(job=job, start=0)
    assert resume.lost_seconds == pytest.approx(7 * 60, abs=5)


@pytest.mark.django_db
def test_without_a_checkpoint_the_attempt_starts_over(store_kind):
    job = JobFactory()
    advance_to(job, JobStatus.RUNNING)
    advance_to(job, JobStatus.PREEMPTED)
    advance_to(job, JobStatus.QUEUED, attempt=2)
    job.refresh_from_db()
    resume = job_resume_prepare(job=job, start=0)
    assert (resume.step, resume.manifest_key, resume.lost_seconds) == (None, "", None)
    assert "no complete checkpoint" in job.events.last().reason


@pytest.mark.django_db
def test_the_periodic_pass_prunes_active_jobs(store_kind, tmp_path, settings):
    settings.CHECKPOINT_KEEP_LAST = 2
    running, queued = JobFactory(), JobFactory()
    advance_to(running, JobStatus.RUNNING)
    for job in (running, queued):
        for step in (1, 2, 3):
            save(job, tmp_path, step)
    assert jobs_checkpoints_prune_task.apply().get() == 2
    for job in (running, queued):
        assert [c.step for c in checkpoint_store().checkpoints(job_store_prefix(job))] == [2, 3]


@pytest.mark.django_db
def test_a_large_file_goes_up_in_parts_and_counts_once_whole(
    s3_endpoint, settings, monkeypatch, tmp_path
):
    request_bucket = f"{BUCKET}-large-{_free_port()}"
    settings.CHECKPOINT_STORE_URL = f"s3://{request_bucket}"
    settings.CHECKPOINT_STORE_ENDPOINT = s3_endpoint
    settings.CHECKPOINT_STORE_REGION = "us-east-1"
    settings.CHECKPOINT_STORE_ACCESS_KEY_ID = "console-key"
    settings.CHECKPOINT_STORE_SECRET_ACCESS_KEY = "console-secret"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="console-key",
        aws_secret_access_key="console-secret",
    )
    client.create_bucket(Bucket=request_bucket)
    for name, value in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "console-key",
        "AWS_SECRET_ACCESS_KEY": "console-secret",
    }.items():
        monkeypatch.setenv(name, value)
    job = JobFactory()
    big = tmp_path / "model.pt"
    big.write_bytes(b"w" * (9 << 20))  # above boto3's 8 MiB multipart threshold
    sdk.save([big], step=1, url=job_url(job))
    head = client.head_object(Bucket=request_bucket, Key=f"{job_store_prefix(job)}1/model.pt")
    assert head["ContentLength"] == 9 << 20
    assert head["ETag"].strip('"').endswith("-2")  # a multipart upload's ETag: two parts
    [found] = checkpoint_store().checkpoints(job_store_prefix(job))
    assert found.size_bytes == 9 << 20


@pytest.mark.django_db
def test_a_planted_symlink_never_reaches_another_jobs_files(settings, tmp_path):
    settings.CHECKPOINT_STORE_URL = f"file://{tmp_path / 'store'}"
    mine, theirs = JobFactory(), JobFactory()
    for step in (1, 2):
        save(theirs, tmp_path, step)
    store = checkpoint_store()
    their_folder = store.local_folder(job_store_prefix(theirs))
    my_folder = store.local_folder(job_store_prefix(mine))
    my_folder.mkdir(parents=True)
    (my_folder / "1").symlink_to(their_folder / "1")  # a whole checkpoint, through a link
    (my_folder / "2").mkdir()
    (my_folder / "2" / MANIFEST_NAME).symlink_to(their_folder / "2" / MANIFEST_NAME)
    assert store.checkpoints(job_store_prefix(mine)) == []
    store.delete_checkpoint(job_store_prefix(mine), 1)
    store.delete_checkpoint(job_store_prefix(mine), 2)
    assert [c.step for c in store.checkpoints(job_store_prefix(theirs))] == [1, 2]


@pytest.mark.django_db
def test_an_unreachable_store_puts_the_start_off_and_the_page_says_so(world, catalog, settings):
    job = JobFactory(tenant=world.tenant)
    advance_to(job, JobStatus.RUNNING)
    job = job_apply_observation(job=job, observation=Observation(phase="preempted"))
    settings.CHECKPOINT_STORE_URL = "s3://nowhere"
    settings.CHECKPOINT_STORE_ENDPOINT = f"http://127.0.0.1:{_free_port()}"  # nothing listens
    settings.CHECKPOINT_STORE_REGION = "us-east-1"
    settings.CHECKPOINT_STORE_ACCESS_KEY_ID = "k"
    settings.CHECKPOINT_STORE_SECRET_ACCESS_KEY = "s"
    job.refresh_from_db()
    if job.status == JobStatus.QUEUED:
        advance_to(job, JobStatus.DISPATCHING)
    job = job_dispatch(job=job)
    assert job.status == JobStatus.DISPATCHING  # not started from scratch: put off
    assert "checkpoint store could not be read" in job.status_reason
    assert not JobResume.objects.filter(job=job).exists()
    found = job_checkpoints(job=job)
    assert found.checkpoints == [] and "could not be read" in found.unavailable


@pytest.mark.django_db
@pytest.mark.parametrize("store_kind", ["s3"], indirect=True)  # presigned URLs are S3's
def test_a_presigned_url_reads_a_manifest_over_plain_http(store_kind, tmp_path):
    job = JobFactory()
    save(job, tmp_path, 3)
    store = checkpoint_store()
    key = f"{job_store_prefix(job)}3/{MANIFEST_NAME}"
    with urllib.request.urlopen(store.presigned_url(key, expires_in=60)) as answer:
        assert json.loads(answer.read())["step"] == 3
