"""The `checkpoint` event and pruning after each checkpoint, on the folder store and on
moto's S3 server (over HTTP, through boto3): the event is authenticated by the job's
own token and only makes the console look at the store itself; each newer complete
checkpoint prunes the job's older ones beyond its keep_last, never the one resumed from."""

from __future__ import annotations

import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from jobs.backends.local_checkpoints import checkpoint_environment
from jobs.checkpoints.events import (
    EVENT_BURST,
    EVENT_INTERVAL,
    checkpoint_event_job,
    checkpoint_event_retry_after,
    checkpoint_event_token,
    checkpoint_event_turn,
)
from jobs.checkpoints.store import MANIFEST_NAME, checkpoint_store
from jobs.models import Job, JobStatus
from jobs.services.checkpoints import job_checkpoint_record, job_store_prefix
from jobs.services.spec import spec_from_job
from tests.conftest import token_client
from tests.factories import JobFactory
from tests.jobs.test_checkpoints import (  # noqa: F401  (fixtures)
    put_raw,
    s3_endpoint,
    save,
    store_kind,
)
from tests.jobs_helpers import advance_to


def steps(job) -> list[int]:
    return [c.step for c in checkpoint_store().checkpoints(job_store_prefix(job))]


def post_event(job_id: int, token: str | None):
    headers = {"HTTP_AUTHORIZATION": f"Bearer {token}"} if token is not None else {}
    return APIClient().post(f"/api/v1/jobs/{job_id}/checkpoint-events", {}, **headers)


@pytest.mark.django_db
def test_the_token_names_one_job_of_one_tenant():
    job = JobFactory()
    token = checkpoint_event_token(tenant_id=job.tenant_id, job_id=job.pk)
    assert checkpoint_event_job(token) == (job.tenant_id, job.pk)
    assert checkpoint_event_job(token.replace(f".{job.pk}:", f".{job.pk + 1}:")) is None
    assert checkpoint_event_job("garbage") is None


@pytest.mark.django_db
@pytest.mark.usefixtures("store_kind")
def test_each_checkpoint_event_records_the_newest_and_prunes(tmp_path, settings):
    settings.CHECKPOINT_KEEP_LAST = 2
    job = JobFactory()
    advance_to(job, JobStatus.RUNNING)
    token = checkpoint_event_token(tenant_id=job.tenant_id, job_id=job.pk)
    for step in (1, 2, 3, 4):
        save(job, tmp_path, step)
        answer = post_event(job.pk, token)
        assert answer.status_code == 200, answer.content
        assert answer.json()["step"] == step
        # Pruned at once, not at the job's end or the next scan.
        assert steps(job) == list(range(max(1, step - 1), step + 1))
    job.refresh_from_db()
    assert job.last_checkpoint_step == 4 and job.last_checkpoint_at is not None


@pytest.mark.django_db
@pytest.mark.usefixtures("store_kind")
def test_the_event_records_only_what_the_store_holds_complete(tmp_path):
    job = JobFactory()
    token = checkpoint_event_token(tenant_id=job.tenant_id, job_id=job.pk)
    save(job, tmp_path, 5)
    # A manifest listing a file that isn't there: whatever the job claims, not recorded.
    put_raw(job, f"9/{MANIFEST_NAME}", b'{"step": 9, "time": "2026-01-01T00:00:00+00:00",'
            b' "files": [{"path": "model.pt", "size": 4}]}')  # fmt: skip
    assert post_event(job.pk, token).json() == {"step": 5, "pruned": []}
    job.refresh_from_db()
    assert job.last_checkpoint_step == 5


@pytest.mark.django_db
@pytest.mark.usefixtures("store_kind")
def test_the_recorded_step_never_moves_back(tmp_path):
    job = JobFactory()
    save(job, tmp_path, 8)
    job_checkpoint_record(job=job)
    stale = Job.objects.get(pk=job.pk)
    stale.last_checkpoint_step = 3  # a reader that saw an older listing
    Job.objects.filter(pk=job.pk).update(last_checkpoint_step=8)
    checkpoint_store().delete_checkpoint(job_store_prefix(job), 8)
    save(job, tmp_path, 6)
    job_checkpoint_record(job=stale)
    job.refresh_from_db()
    assert job.last_checkpoint_step == 8


@pytest.mark.django_db
@pytest.mark.usefixtures("store_kind")
def test_the_job_spec_keep_last_wins_and_the_resumed_one_stays(tmp_path, settings):
    settings.CHECKPOINT_KEEP_LAST = 3
    job = JobFactory(checkpoint_keep_last=1)
    save(job, tmp_path, 1)
    job.resume_from = f"1/{MANIFEST_NAME}"
    job.save(update_fields=["resume_from"])
    for step in (2, 3):
        save(job, tmp_path, step)
        job_checkpoint_record(job=Job.objects.get(pk=job.pk))
    assert steps(job) == [1, 3]  # 2 pruned; 1 is what this attempt resumed from


@pytest.mark.django_db
@pytest.mark.usefixtures("store_kind")
def test_a_token_works_only_for_its_own_job(tmp_path):
    mine, theirs = JobFactory(), JobFactory()
    same_tenant = JobFactory(tenant=mine.tenant)
    save(theirs, tmp_path, 1)
    token = checkpoint_event_token(tenant_id=mine.tenant_id, job_id=mine.pk)
    for other in (theirs, same_tenant):
        answer = post_event(other.pk, token)
        # Another job's token reaches nothing: 404, as for any tenant's foreign job.
        assert answer.status_code == 404
        assert answer.json()["code"] == "not_found"
    assert post_event(mine.pk, None).status_code == 401
    assert post_event(mine.pk, "not-a-token").status_code == 404
    # A token for a job that isn't (any more) there: 404, nothing else said.
    ghost = checkpoint_event_token(tenant_id=mine.tenant_id, job_id=theirs.pk + 1000)
    assert post_event(theirs.pk + 1000, ghost).status_code == 404
    # Another tenant's job id with a token forged for it under my tenant: no such job.
    forged = checkpoint_event_token(tenant_id=mine.tenant_id, job_id=theirs.pk)
    assert post_event(theirs.pk, forged).status_code == 404
    # Nothing was recorded for theirs although a checkpoint of it is in the store.
    assert Job.objects.get(pk=theirs.pk).last_checkpoint_step is None


@pytest.mark.django_db
@pytest.mark.usefixtures("store_kind")
def test_a_finished_jobs_token_no_longer_counts(tmp_path):
    job = JobFactory()
    advance_to(job, JobStatus.SUCCEEDED)
    token = checkpoint_event_token(tenant_id=job.tenant_id, job_id=job.pk)
    assert post_event(job.pk, token).status_code == 409


@pytest.mark.django_db
@pytest.mark.usefixtures("store_kind")
def test_jobs_get_the_event_url_and_their_token_only_when_reachable(settings):
    job = JobFactory()
    settings.CONSOLE_URL_FOR_JOBS = ""
    env = checkpoint_environment(job, sandboxed=False)
    assert "GPUGEEK_CHECKPOINT_NOTIFY_URL" not in env
    settings.CONSOLE_URL_FOR_JOBS = "https://console.example/"
    env = checkpoint_environment(job, sandboxed=False)
    assert env["GPUGEEK_CHECKPOINT_NOTIFY_URL"] == (
        f"https://console.example/api/v1/jobs/{job.pk}/checkpoint-events"
    )
    assert checkpoint_event_job(env["GPUGEEK_CHECKPOINT_TOKEN"]) == (job.tenant_id, job.pk)


@pytest.mark.django_db
def test_the_spec_carries_keep_last_and_the_api_shows_what_was_recorded(
    world, catalog, settings, tmp_path
):
    settings.CHECKPOINT_STORE_URL = f"file://{tmp_path / 'store'}"
    api = token_client(world.member, world.tenant)
    spec = {"name": "keep", "image": "python-3.11", "command": ["true"], "cpus": 1}
    for bad in (0, 101, "three", True):
        answer = api.post("/api/v1/jobs", {**spec, "checkpoint_keep_last": bad}, format="json")
        assert answer.status_code == 400, (bad, answer.content)
        assert "checkpoint_keep_last" in json.dumps(answer.json())
    answer = api.post("/api/v1/jobs", {**spec, "checkpoint_keep_last": 2}, format="json")
    assert answer.status_code == 201, answer.content
    job = Job.objects.get(pk=answer.json()["id"])
    assert job.checkpoint_keep_last == 2
    assert (answer.json()["last_checkpoint_step"], answer.json()["last_checkpoint_at"]) == (
        None,
        None,
    )
    for step in (1, 2, 3):
        save(job, tmp_path, step)
    assert job_checkpoint_record(job=job).pruned == [1]
    shown = api.get(f"/api/v1/jobs/{job.pk}").json()
    assert (shown["checkpoint_keep_last"], shown["last_checkpoint_step"]) == (2, 3)
    assert spec_from_job(job).checkpoint_keep_last == 2  # a clone keeps it
    # The list answers it too (its columns include the new ones: no query per row).
    listed = api.get("/api/v1/jobs").json()["results"]
    assert {row["id"]: row["last_checkpoint_step"] for row in listed}[job.pk] == 3


def test_the_event_rate_is_a_burst_then_one_per_interval():
    start = datetime(2026, 12, 4, tzinfo=UTC)
    per_interval = int(EVENT_INTERVAL.total_seconds())
    # A burst at one instant: EVENT_BURST taken, the next refused.
    due = None
    for _ in range(EVENT_BURST):
        due = checkpoint_event_turn(due_at=due, now=start)
        assert due is not None
    assert checkpoint_event_turn(due_at=due, now=start) is None
    # An event every second for a minute: never more than the burst plus one per
    # interval, and once the burst is spent, exactly one per interval.
    due, taken = None, []
    for second in range(61):
        turn = checkpoint_event_turn(due_at=due, now=start + timedelta(seconds=second))
        if turn is not None:
            due = turn
            taken.append(second)
    assert len(taken) <= EVENT_BURST + 60 // per_interval
    steady = taken[-5:]
    assert [b - a for a, b in itertools.pairwise(steady)] == [per_interval] * 4
    # Refused: how long until one would be taken again, and then it is.
    refused_at = start + timedelta(seconds=60.5)
    assert checkpoint_event_turn(due_at=due, now=refused_at) is None
    wait = checkpoint_event_retry_after(due_at=due, now=refused_at)
    assert 0 < wait <= per_interval
    assert checkpoint_event_turn(due_at=due, now=refused_at + timedelta(seconds=wait)) is not None


@pytest.mark.django_db
@pytest.mark.usefixtures("store_kind")
def test_a_job_posting_too_fast_gets_429_and_bad_tokens_cost_it_nothing(tmp_path):
    job = JobFactory()
    advance_to(job, JobStatus.RUNNING)
    token = checkpoint_event_token(tenant_id=job.tenant_id, job_id=job.pk)
    save(job, tmp_path, 1)
    for _ in range(EVENT_BURST * 2):  # someone without the token: refused, not counted
        assert post_event(job.pk, "not-a-token").status_code == 404
    for _ in range(EVENT_BURST):
        assert post_event(job.pk, token).status_code == 200
    refused = post_event(job.pk, token)
    assert refused.status_code == 429, refused.content
    assert refused.json()["code"] == "throttled"
    assert "periodic scan" in refused.json()["detail"]
    assert 1 <= int(refused.headers["Retry-After"]) <= EVENT_INTERVAL.total_seconds()
    # Time passes (the due time moves back one interval): one more event is taken.
    Job.objects.filter(pk=job.pk).update(
        checkpoint_event_due_at=Job.objects.get(pk=job.pk).checkpoint_event_due_at - EVENT_INTERVAL
    )
    assert post_event(job.pk, token).status_code == 200
    assert post_event(job.pk, token).status_code == 429
