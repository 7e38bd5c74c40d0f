"""Lost work on the invoice: the line of a preempted spot job says how many GPU-seconds
were redone since its last checkpoint (the resume's lost_seconds × the GPUs of the new
attempt on that tier), exactly, as a Decimal, in the HTML and PDF invoice and the API;
counted once even when the attempt's usage spans lines or invoices."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from billing.invoices.services import invoice_draft_create, invoice_finalize
from billing.metering import meter_tick
from billing.models import LineKind
from jobs.checkpoints.store import MANIFEST_NAME, checkpoint_store
from jobs.models import JobResume, JobStatus
from jobs.services.checkpoints import job_resume_prepare, job_store_prefix
from tests.billing.conftest import set_status
from tests.billing.test_invoice_pdf import page_text, pdf_of
from tests.billing.test_invoices import DEC, JAN, NOV
from tests.billing.test_ledger_properties import gpu_job
from tests.conftest import signed_in_client, token_client
from tests.jobs_helpers import at_time


def write_checkpoint(job, *, step: int, at) -> None:
    """A complete checkpoint as the job's helper writes it: the file, the manifest last."""
    folder = checkpoint_store().local_folder(job_store_prefix(job))
    (folder / str(step)).mkdir(parents=True)
    (folder / str(step) / "model.pt").write_bytes(b"w" * 16)
    manifest = {"step": step, "time": at.isoformat(), "files": [{"path": "model.pt", "size": 16}]}
    (folder / str(step) / MANIFEST_NAME).write_text(json.dumps(manifest))


def run(job, start, end) -> None:
    at = start + timedelta(minutes=20)
    while at < end:
        meter_tick(now=at)
        at += timedelta(minutes=20)


@pytest.fixture
def preempted(world, catalog, settings, tmp_path):
    """2 × 1 H100 (one rank on spot), checkpointed 10 min 0.25 s in, preempted 47 min
    in; the second attempt resumes from the checkpoint and runs 2 h, into December."""
    settings.CHECKPOINT_STORE_URL = f"file://{tmp_path / 'store'}"
    start = DEC - timedelta(hours=1)
    with at_time(start - timedelta(seconds=5)):
        job = gpu_job(world, name="spot-train")
    set_status(job, JobStatus.RUNNING, start)
    write_checkpoint(job, step=100, at=start + timedelta(minutes=10, microseconds=250_000))
    preempted_at = start + timedelta(minutes=47)
    run(job, start, preempted_at)
    set_status(job, JobStatus.PREEMPTED, preempted_at)
    meter_tick(now=preempted_at + timedelta(seconds=1))
    set_status(job, JobStatus.QUEUED, preempted_at, attempt=2)
    resume = job_resume_prepare(job=job, start=0)
    restart = preempted_at + timedelta(minutes=3)
    set_status(job, JobStatus.RUNNING, restart)
    run(job, restart, restart + timedelta(hours=2))
    set_status(job, JobStatus.SUCCEEDED, restart + timedelta(hours=2))
    meter_tick(now=restart + timedelta(hours=2, seconds=1))
    assert resume.step == 100 and resume.lost_seconds == pytest.approx(36 * 60 + 59.75)
    return job


def test_the_preempted_jobs_lines_say_the_gpu_seconds_redone(world, preempted):
    # The second attempt started in November: its redone work is on November's invoice.
    november = invoice_finalize(
        invoice=invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC),
        user=None,
    )
    lines = {line.tier: line for line in november.lines.filter(kind=LineKind.USAGE)}
    assert set(lines) == {"on_demand", "spot"}
    for line in lines.values():  # one GPU on each tier redoes 36 min 59.75 s
        assert line.redone_gpu_seconds == Decimal("2219.750")
        assert isinstance(line.redone_gpu_seconds, Decimal)
        assert "incl. 2,220 GPU-seconds redone after preemption" in line.description
    # December bills the rest of the same attempt: the redone work is not counted again.
    december = invoice_draft_create(tenant=world.tenant, period_start=DEC, period_end=JAN)
    assert december.lines.exists()
    assert all(line.redone_gpu_seconds is None for line in december.lines.all())
    assert "redone" not in " ".join(december.lines.values_list("description", flat=True))

    client = signed_in_client(world.finance, world.tenant)
    html = client.get(reverse("billing:invoice_detail", args=[november.pk])).content.decode()
    assert html.count("2,220 GPU-seconds redone after preemption") == 2
    assert "2,220 GPU-seconds redone" in page_text(pdf_of(client, november).content)
    api = token_client(world.finance, world.tenant)
    body = api.get(f"/api/v1/invoices/{november.pk}").json()
    assert {line["redone_gpu_seconds"] for line in body["lines"]} == {"2219.750"}


def test_a_resume_without_a_checkpoint_or_a_pause_adds_nothing(world, preempted):
    JobResume.objects.filter(job=preempted).update(lost_seconds=None)
    draft = invoice_draft_create(tenant=world.tenant, period_start=NOV, period_end=DEC)
    assert all(line.redone_gpu_seconds is None for line in draft.lines.all())
