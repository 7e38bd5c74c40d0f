"""A real Celery worker process consumes what the web side enqueues after commit."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.db import transaction

from console.models import Heartbeat
from console.services.invitations import invitation_create
from tests.servers import wait_until

pytestmark = pytest.mark.integration


def _mail_files(mail_dir: Path) -> list[Path]:
    return sorted(mail_dir.glob("*")) if mail_dir.exists() else []


def _written_mail(mail_dir: Path) -> list[Path]:
    # The file backend creates the file before it writes the message: wait for both.
    files = _mail_files(mail_dir)
    return files if files and all(f.read_text().rstrip().endswith("-" * 79) for f in files) else []


def _wait_or_show_log(worker, predicate, what: str, timeout: float = 30):
    try:
        return wait_until(predicate, timeout, what=what)
    except AssertionError as error:
        raise AssertionError(f"{error}\nworker log:\n{worker.log()}") from None


def test_worker_sends_invitation_email_after_commit_and_records_heartbeat(
    transactional_db, celery_worker_process, world
):
    worker = celery_worker_process
    accept_base = "http://console.test/invitations/accept/"
    with transaction.atomic():
        _invitation, raw_token = invitation_create(
            tenant=world.tenant,
            by_membership=world.membership(world.owner),
            email="newcomer@example.org",
            role="member",
            accept_url_for=lambda token: f"{accept_base}{token}/",
        )
        # Still inside the transaction: nothing may have been queued, so nothing is sent.
        time.sleep(1)
        assert _mail_files(worker.mail_dir) == [], "e-mail sent before the invitation committed"

    files = _wait_or_show_log(worker, lambda: _written_mail(worker.mail_dir), "the e-mail, written")
    assert len(files) == 1
    message = files[0].read_text()
    assert f"Accept: {accept_base}{raw_token}/" in message
    assert "To: newcomer@example.org" in message
    assert f"Subject: You are invited to {world.tenant.name} on GpuGeek" in message

    # The worker's bootstep records its heartbeat at start, for /healthz.
    heartbeat = _wait_or_show_log(
        worker, lambda: Heartbeat.objects.filter(component="worker").first(), "the heartbeat"
    )
    # --pool solo: the heartbeat comes from the worker process itself.
    assert heartbeat.pid == worker.process.pid
