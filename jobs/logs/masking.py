"""Masking a job's secret values (its secret env, including tenant secrets it
references) in every log line jobs.logs returns or publishes."""

from __future__ import annotations

import re
from collections.abc import Iterable

from console.crypto import decrypt_json
from jobs.models import Job

MASK = "••••••"
# Shorter secret values are not masked: they would blank out ordinary words and digits.
MIN_SECRET_LENGTH = 4


def job_secret_values(job: Job) -> list[str]:
    """The job's secret values worth masking, longest first (a value containing another
    is masked whole)."""
    try:
        values = decrypt_json(job.secret_env_encrypted).values()
    except ValueError:
        return []
    found = {str(v) for v in values if len(str(v)) >= MIN_SECRET_LENGTH}
    return sorted(found, key=len, reverse=True)


class SecretMasker:
    def __init__(self, secrets: Iterable[str]):
        secrets = list(secrets)
        self.pattern = re.compile("|".join(re.escape(s) for s in secrets)) if secrets else None

    def __call__(self, text: str) -> str:
        if self.pattern is None:
            return text
        return self.pattern.sub(MASK, text)
