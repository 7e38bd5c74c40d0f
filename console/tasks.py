"""Celery tasks of the console shell: thin, each calls one thing and is safe to rerun."""

from __future__ import annotations

import smtplib

from celery import shared_task
from django.core.mail import send_mail


@shared_task(
    bind=True,
    acks_late=True,
    autoretry_for=(smtplib.SMTPException, OSError),
    retry_backoff=True,
    retry_jitter=True,
    max_retries=8,
)
def send_email_task(self, subject: str, body: str, recipients: list[str]) -> None:
    """Mail goes out from the worker so a slow SMTP server never blocks a page."""
    send_mail(subject, body, None, recipients, fail_silently=False)
