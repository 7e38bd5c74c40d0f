"""The job list writes each job as the job's own page does (one serializer, two ways of
reading: the list reads a row's columns and slugs, the page the whole job), for jobs in
every kind of state; and the list pages by cursor."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from decimal import Decimal

from django.utils import timezone
from rest_framework import serializers

from jobs.api.serializers import ROW_COLUMNS, JobSerializer
from jobs.extensions import job_costs
from jobs.models import Job, JobStatus
from jobs.services import tenant_secret_set
from tests.jobs.test_api import JOBS, launch, local_cpu_pool, member_api
from tests.jobs_helpers import advance_to

__all__ = ["member_api"]  # the fixture, imported for these tests


def test_list_rows_equal_each_job_s_page_for_every_kind_of_job(member_api, world, monkeypatch):
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="HF_TOKEN", value="hf_x")
    running = launch(member_api, name="running", labels={"team": "nlp"}, env={"A": "1"})
    finished = launch(member_api, name="finished")
    advance_to(Job.objects.get(pk=running["id"]), JobStatus.RUNNING)
    advance_to(Job.objects.get(pk=finished["id"]), JobStatus.SUCCEEDED)
    launch(member_api, name="filler", cpus=local_cpu_pool().allocatable_vcpus)
    launch(member_api, name="queued", secret_env={"HF_TOKEN": "hf_y"}, project="p")
    statuses = set(Job.objects.values_list("status", flat=True))
    assert statuses >= {JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.SUCCEEDED}
    # One instant for every reading: a running job's cost grows by the microdollar.
    instant = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: instant)
    listed = member_api.get(f"{JOBS}?page_size=50").json()["results"]
    assert len(listed) == 4
    for row in listed:
        assert member_api.get(f"{JOBS}/{row['id']}").json() == row
    assert any(row["queue_position"] == 1 for row in listed)
    assert any(row["secret_env"] == {"HF_TOKEN": "••••••"} for row in listed)
    assert any(row["gpu_type"] is None and row["region"] for row in listed)
    assert all(Decimal(row["cost_to_date"]) >= 0 for row in listed)


def test_the_list_pages_by_cursor_with_a_capped_count(member_api):
    for number in range(5):
        launch(member_api, name=f"job {number}")
    first = member_api.get(f"{JOBS}?page_size=2").json()
    assert (first["count"], first["count_capped"], first["previous"]) == (5, False, None)
    assert "cursor=" in first["next"]
    second = member_api.get(first["next"]).json()
    assert (second["count"], second["count_capped"]) == (None, None)  # counted once
    third = member_api.get(second["next"]).json()
    names = [row["name"] for page in (first, second, third) for row in page["results"]]
    assert names == [f"job {n}" for n in range(4, -1, -1)]
    assert third["next"] is None
    # Clients of the page-number envelope keep working.
    numbered = member_api.get(f"{JOBS}?page=2&page_size=2").json()
    assert [row["name"] for row in numbered["results"]] == ["job 2", "job 1"]
    assert "count_capped" not in numbered
    assert member_api.get(f"{JOBS}?cursor=garbage").status_code == 404
    # A well-formed cursor whose position isn't a time: invalid too, not a server error.
    edited = base64.b64encode(b"p=yesterday").decode()
    answer = member_api.get(f"{JOBS}?cursor={edited}")
    assert (answer.status_code, answer.json()["detail"]) == (404, "Invalid cursor")
    # Back from the last page, the pages come again in order (a reversed cursor).
    assert member_api.get(third["previous"]).json()["results"] == second["results"]
    assert member_api.get(second["previous"]).json()["results"] == first["results"]


def test_a_list_row_reads_every_column_its_cost_reads():
    # Else each priced configuration would load a deferred column with a query of its own.
    assert set(job_costs().cost_columns) <= set(ROW_COLUMNS)


def test_a_time_is_written_as_drf_s_datetime_field_writes_it():
    written = serializers.DateTimeField()
    for zone in ("UTC", "Europe/Paris", "America/New_York"):
        with timezone.override(zone):
            for value in (
                datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
                datetime(2026, 7, 1, 23, 59, 59, 123456, tzinfo=UTC),
            ):
                assert JobSerializer()._timestamp(value) == written.to_representation(value)
            assert JobSerializer()._timestamp(None) is None
