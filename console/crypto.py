"""Encryption at rest for tenant secrets (Fernet: AES-128-CBC + HMAC-SHA256).

Keys come from SECRETS_ENCRYPTION_KEYS (comma-separated Fernet keys, newest first, so keys
can rotate); without it, one key is derived from SECRET_KEY, so changing SECRET_KEY then
makes stored secrets unreadable.
"""

from __future__ import annotations

import base64
import json
from functools import cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


@cache
def _fernet() -> MultiFernet:
    keys = [k for k in settings.SECRETS_ENCRYPTION_KEYS if k]
    if not keys:
        derived = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=b"gpugeek-secrets", info=b"fernet"
        ).derive(settings.SECRET_KEY.encode())
        keys = [base64.urlsafe_b64encode(derived).decode()]
    return MultiFernet([Fernet(key) for key in keys])


def encrypt_json(value) -> str:
    return _fernet().encrypt(json.dumps(value).encode()).decode()


def decrypt_json(token: str):
    if not token:
        return {}
    try:
        return json.loads(_fernet().decrypt(token.encode()))
    except InvalidToken as error:
        raise ValueError("stored secret can't be decrypted with the configured keys") from error


def mask(value: str) -> str:
    return "••••••" if value else ""
