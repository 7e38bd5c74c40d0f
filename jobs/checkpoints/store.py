"""The checkpoint store: `CHECKPOINT_STORE_URL` is `s3://bucket/prefix` (any S3-compatible
service through boto3, `CHECKPOINT_STORE_ENDPOINT` for MinIO/Ceph) or `file:///folder`.

The interface is small on purpose: list what lies under a prefix (keys and sizes, one
listing), read one object, delete a prefix, and say what a job must be told to reach its
own prefix. Completeness (the manifest written last, its files present with their sizes)
is judged once, in `CheckpointStore.checkpoints`, for both kinds of store.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from jobs.checkpoints.events import (
    checkpoint_credentials_environment,
    checkpoint_event_environment,
)

MANIFEST_NAME = "gpugeek-checkpoint.json"
# A manifest bigger than this is not one of ours (it is read into memory).
MANIFEST_MAX_BYTES = 1 << 20
_STEP = re.compile(r"\d{1,18}")


@dataclass(frozen=True)
class CheckpointFile:
    path: str  # relative to the checkpoint's folder
    size: int


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint of a job (its manifest read and verified)."""

    step: int
    time: datetime
    files: tuple[CheckpointFile, ...]
    metrics: dict[str, Any] = field(default_factory=dict)
    # The manifest's key relative to the job's prefix: `<step>/gpugeek-checkpoint.json`.
    manifest_key: str = ""

    @property
    def size_bytes(self) -> int:
        return sum(item.size for item in self.files)


def job_prefix(*, tenant_id: int, job_id: int) -> str:
    """A job's own prefix in the store; nothing of it is chosen by the user."""
    return f"{int(tenant_id)}/{int(job_id)}/"


def _relative_file(path: Any) -> str | None:
    """A manifest's file path if it stays inside its checkpoint's folder, else None."""
    if not isinstance(path, str) or not path or "\\" in path or "\x00" in path:
        return None
    pure = PurePosixPath(path)
    if pure.is_absolute() or any(part in ("..", ".", "") for part in path.split("/")):
        return None
    return str(pure)


def parse_manifest(raw: bytes, *, step: int) -> Checkpoint | None:
    """The manifest's checkpoint, or None when it isn't a valid one for `step`."""
    try:
        data = json.loads(raw)
        files = tuple(
            CheckpointFile(path=str(_relative_file(entry["path"])), size=int(entry["size"]))
            for entry in data["files"]
            if _relative_file(entry["path"]) is not None
        )
        if len(files) != len(data["files"]) or any(item.size < 0 for item in files):
            return None
        if int(data["step"]) != step:
            return None
        time = datetime.fromisoformat(str(data["time"]))
        metrics = data.get("metrics") or {}
    except (ValueError, KeyError, TypeError):
        return None
    if time.tzinfo is None:
        time = time.replace(tzinfo=UTC)
    if not isinstance(metrics, dict):
        metrics = {}
    return Checkpoint(
        step=step,
        time=time,
        files=files,
        metrics=metrics,
        manifest_key=f"{step}/{MANIFEST_NAME}",
    )


class CheckpointStore(ABC):
    """One installation's store. Keys are relative to the store's own base."""

    url: str

    @abstractmethod
    def sizes(self, prefix: str) -> dict[str, int]:
        """Every object under `prefix` (keys relative to the prefix) and its size."""

    @abstractmethod
    def read(self, key: str) -> bytes:
        """One object's bytes (at most MANIFEST_MAX_BYTES are needed)."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> None:
        """Remove everything under `prefix` (gone already is fine)."""

    @abstractmethod
    def copy_prefix(self, source: str, target: str) -> None:
        """Copy everything under `source` to `target` (inside the store)."""

    @abstractmethod
    def job_environment(
        self, prefix: str, *, mounted_at: str | None, renewal: dict[str, str] | None = None
    ) -> dict[str, str]:
        """What a job is told to reach its own prefix, and only it: GPUGEEK_CHECKPOINT_URL
        plus credentials. `mounted_at`: where a folder store's job folder is bind-mounted;
        `renewal`: where the job fetches renewed temporary credentials (instead of being
        handed ones that expire), when the store issues such credentials."""

    @property
    def issues_temporary_credentials(self) -> bool:
        """Whether jobs get credentials that expire (and may renew them at the console)."""
        return False

    def local_folder(self, prefix: str) -> Path | None:
        """A folder store's folder for the prefix (to bind-mount), else None."""
        return None

    def isolation_note(self) -> str:
        """What a job's page says about how far its store access reaches ("": nothing)."""
        return ""

    def network_endpoint(self) -> tuple[str, int] | None:
        """(host, port) jobs reach the store at when it is a service of its own address
        (CHECKPOINT_STORE_ENDPOINT: MinIO, Ceph), for the tenant's egress policy; None
        for a folder, or AWS S3 itself (public addresses, already allowed)."""
        return None

    def object_url(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}"

    def checkpoints(self, prefix: str) -> list[Checkpoint]:
        """The prefix's complete checkpoints, oldest step first: a manifest counts only
        when it parses and every file it lists exists with that size."""
        listing = self.sizes(prefix)
        found = []
        for key, size in listing.items():
            step_text, _, name = key.partition("/")
            if name != MANIFEST_NAME or not _STEP.fullmatch(step_text):
                continue
            if size > MANIFEST_MAX_BYTES:
                continue
            try:
                raw = self.read(prefix + key)
            except FileNotFoundError:
                continue  # pruned or deleted since the listing
            checkpoint = parse_manifest(raw, step=int(step_text))
            if checkpoint is None:
                continue
            if all(
                listing.get(f"{step_text}/{item.path}") == item.size for item in checkpoint.files
            ):
                found.append(checkpoint)
        return sorted(found, key=lambda checkpoint: checkpoint.step)

    def latest(self, prefix: str) -> Checkpoint | None:
        complete = self.checkpoints(prefix)
        return complete[-1] if complete else None

    def delete_checkpoint(self, prefix: str, step: int) -> None:
        """Remove one checkpoint: its manifest first, so that it stops counting before
        any of its files goes."""
        self.delete_prefix(f"{prefix}{int(step)}/{MANIFEST_NAME}")
        self.delete_prefix(f"{prefix}{int(step)}/")


class FileCheckpointStore(CheckpointStore):
    """A folder on the console's host (the embedded default)."""

    def __init__(self, root: Path):
        self.root = root
        self.url = f"file://{root}"

    def _path(self, key: str) -> Path:
        """The key's path, refusing `..` and any symlink on the way: a job owns its
        folder and could plant one to point the console at another job's files."""
        parts = [part for part in key.split("/") if part]
        if any(part in (".", "..") for part in parts):
            raise ValueError(f"{key!r} is outside the checkpoint store")
        path = self.root
        for part in parts:
            path = path / part
            if path.is_symlink():
                raise FileNotFoundError(key)
        return path

    def sizes(self, prefix: str) -> dict[str, int]:
        base = self._path(prefix)
        listing: dict[str, int] = {}
        if not base.is_dir():
            return listing
        for folder, _dirs, names in os.walk(base):
            for name in names:
                path = Path(folder) / name
                if path.is_symlink() or not path.is_file():
                    continue  # a job's symlink never makes something outside count
                listing[str(path.relative_to(base))] = path.stat().st_size
        return listing

    def read(self, key: str) -> bytes:
        descriptor = os.open(self._path(key), os.O_RDONLY | os.O_NOFOLLOW)
        with open(descriptor, "rb") as handle:
            return handle.read(MANIFEST_MAX_BYTES + 1)

    def delete_prefix(self, prefix: str) -> None:
        try:
            path = self._path(prefix)
        except FileNotFoundError:
            return  # a symlink planted on the way: there is nothing of ours to delete
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # (rmtree never follows symlinks)
        else:
            path.unlink(missing_ok=True)

    def copy_prefix(self, source: str, target: str) -> None:
        source_path, target_path = self._path(source), self._path(target)
        if source_path.is_dir():
            shutil.copytree(source_path, target_path, symlinks=True, dirs_exist_ok=True)

    def local_folder(self, prefix: str) -> Path | None:
        return self._path(prefix)

    def job_environment(
        self, prefix: str, *, mounted_at: str | None, renewal: dict[str, str] | None = None
    ) -> dict[str, str]:
        return {"GPUGEEK_CHECKPOINT_URL": f"file://{mounted_at or self._path(prefix)}/"}


class S3CheckpointStore(CheckpointStore):
    """A bucket (and base prefix) of any S3-compatible service."""

    def __init__(
        self,
        *,
        bucket: str,
        base: str,
        endpoint: str,
        region: str,
        access_key: str,
        secret_key: str,
    ):
        self.bucket = bucket
        self.base = f"{base.strip('/')}/" if base.strip("/") else ""
        self.endpoint = endpoint
        self.region = region
        self.access_key = access_key
        self.secret_key = secret_key
        self.url = f"s3://{bucket}/{self.base}"
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint or None,
            region_name=region or None,
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            # Dispatch waits on this store: an unreachable one must fail fast (the start is
            # put off and retried), not hold the sweep for a minute.
            config=Config(
                retries={"mode": "standard", "max_attempts": 3},
                connect_timeout=5,
                read_timeout=30,
            ),
        )

    def object_url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.base}{key}"

    def network_endpoint(self) -> tuple[str, int] | None:
        if not self.endpoint:
            return None
        parts = urlsplit(self.endpoint)
        if not parts.hostname:
            return None
        return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)

    def sizes(self, prefix: str) -> dict[str, int]:
        listing: dict[str, int] = {}
        start = self.base + prefix
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=start
        ):
            for item in page.get("Contents", []):
                listing[item["Key"][len(start) :]] = int(item["Size"])
        return listing

    def read(self, key: str) -> bytes:
        try:
            answer = self.client.get_object(
                Bucket=self.bucket, Key=self.base + key, Range=f"bytes=0-{MANIFEST_MAX_BYTES}"
            )
        except self.client.exceptions.NoSuchKey as error:
            raise FileNotFoundError(key) from error
        return answer["Body"].read()

    def delete_prefix(self, prefix: str) -> None:
        keys = [self.base + prefix + key for key in self.sizes(prefix)]
        for start in range(0, len(keys), 1000):  # DeleteObjects takes 1,000 keys a call
            self.client.delete_objects(
                Bucket=self.bucket,
                Delete={"Objects": [{"Key": key} for key in keys[start : start + 1000]]},
            )

    def copy_prefix(self, source: str, target: str) -> None:
        for key in self.sizes(source):  # server-side copies: nothing passes the console
            self.client.copy(
                {"Bucket": self.bucket, "Key": self.base + source + key},
                self.bucket,
                self.base + target + key,
            )

    def presigned_url(self, key: str, *, expires_in: int = 3600) -> str:
        """An HTTPS URL that reads one object for a while (a manifest, for a person)."""
        return self.client.generate_presigned_url(
            "get_object",
            Params={"Bucket": self.bucket, "Key": self.base + key},
            ExpiresIn=expires_in,
        )

    def job_environment(
        self, prefix: str, *, mounted_at: str | None, renewal: dict[str, str] | None = None
    ) -> dict[str, str]:
        env = {"GPUGEEK_CHECKPOINT_URL": f"s3://{self.bucket}/{self.base}{prefix}"}
        if self.endpoint:
            env["AWS_ENDPOINT_URL"] = self.endpoint
        if self.region:
            env["AWS_DEFAULT_REGION"] = self.region
        # Keys in the environment would win over the renewal URL in every AWS SDK.
        env.update(renewal if renewal and self.issues_temporary_credentials else {})
        if "AWS_CONTAINER_CREDENTIALS_FULL_URI" not in env:
            env.update(self.job_credentials(prefix))
        return env

    @property
    def issues_temporary_credentials(self) -> bool:
        return bool(settings.CHECKPOINT_STORE_STS)

    def job_session_policy(self, prefix: str) -> dict[str, Any]:
        """The inline session policy of a job's STS credentials: objects under its own
        prefix only, and listing the bucket only under that prefix."""
        key_prefix = f"{self.base}{prefix}"
        return {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Action": [
                        "s3:GetObject",
                        "s3:PutObject",
                        "s3:DeleteObject",
                        "s3:AbortMultipartUpload",
                        "s3:ListMultipartUploadParts",
                    ],
                    "Resource": f"arn:aws:s3:::{self.bucket}/{key_prefix}*",
                },
                {
                    "Effect": "Allow",
                    "Action": "s3:ListBucket",
                    "Resource": f"arn:aws:s3:::{self.bucket}",
                    "Condition": {"StringLike": {"s3:prefix": [f"{key_prefix}*"]}},
                },
            ],
        }

    def job_credentials(self, prefix: str) -> dict[str, str]:
        """A job's AWS_* credentials, never the console's own: with CHECKPOINT_STORE_STS,
        temporary ones limited to the job's prefix (`job_temporary_credentials`); else the
        installation's job credentials (CHECKPOINT_STORE_JOB_*, limited by the operator,
        not per job)."""
        if not settings.CHECKPOINT_STORE_STS:
            access = settings.CHECKPOINT_STORE_JOB_ACCESS_KEY_ID
            secret = settings.CHECKPOINT_STORE_JOB_SECRET_ACCESS_KEY
            if access and secret:
                return {"AWS_ACCESS_KEY_ID": access, "AWS_SECRET_ACCESS_KEY": secret}
            return {}
        found = self.job_temporary_credentials(prefix)
        return {
            "AWS_ACCESS_KEY_ID": found["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": found["SecretAccessKey"],
            "AWS_SESSION_TOKEN": found["Token"],
        }

    def job_temporary_credentials(self, prefix: str) -> dict[str, str]:
        """Temporary credentials from STS limited by `job_session_policy` to the job's
        prefix, in the container-credentials shape every AWS SDK reads (AccessKeyId,
        SecretAccessKey, Token, Expiration). Cached per prefix (every render of a start
        asks, and so does each renewal) and replaced while they still have at least 20
        minutes, or half their life, left: SDKs renew from 15 minutes before expiry."""
        seconds = settings.CHECKPOINT_STORE_STS_SECONDS
        role = settings.CHECKPOINT_STORE_STS_ROLE_ARN
        cache_key = f"checkpoint-sts:{self.endpoint}:{self.url}:{role}:{prefix}"
        cached = cache.get(cache_key)
        if cached is not None:
            return cached
        policy = json.dumps(self.job_session_policy(prefix), separators=(",", ":"))
        # A session name says whose credentials these are in the store's audit log.
        name = "gpugeek-" + prefix.strip("/").replace("/", "-")
        if role:
            answer = self.sts_client().assume_role(
                RoleArn=role,
                RoleSessionName=name,
                Policy=policy,
                DurationSeconds=seconds,
            )
        else:
            answer = self.sts_client().get_federation_token(
                Name=name[:32], Policy=policy, DurationSeconds=seconds
            )
        credentials = answer["Credentials"]
        expiration = credentials["Expiration"]
        found = {
            "AccessKeyId": credentials["AccessKeyId"],
            "SecretAccessKey": credentials["SecretAccessKey"],
            "Token": credentials["SessionToken"],
            "Expiration": expiration.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        cache.set(cache_key, found, timeout=max(60, min(seconds // 2, seconds - 20 * 60)))
        return found

    def sts_client(self):
        """STS at the store's endpoint (MinIO and Ceph serve it there), with the
        console's own credentials: the only place they are used for a job."""
        return boto3.client(
            "sts",
            endpoint_url=self.endpoint or None,
            region_name=self.region or None,
            aws_access_key_id=self.access_key or None,
            aws_secret_access_key=self.secret_key or None,
            config=Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5),
        )

    def isolation_note(self) -> str:
        if settings.CHECKPOINT_STORE_STS:
            return (
                "Its checkpoint store credentials are temporary and limited to its own "
                "prefix (STS session policy)."
            )
        if settings.CHECKPOINT_STORE_JOB_ACCESS_KEY_ID:
            return (
                "Its checkpoint store credentials are the installation's job credentials, "
                "not limited to its own prefix (STS is not enabled for this store)."
            )
        return "It is given no checkpoint store credentials (none are configured for jobs)."


def store_from_url(url: str) -> CheckpointStore:
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc or not parts.path.startswith("/"):
            raise ImproperlyConfigured("CHECKPOINT_STORE_URL file:// needs an absolute path")
        return FileCheckpointStore(Path(parts.path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise ImproperlyConfigured("CHECKPOINT_STORE_URL s3:// needs a bucket")
        return S3CheckpointStore(
            bucket=parts.netloc,
            base=parts.path,
            endpoint=settings.CHECKPOINT_STORE_ENDPOINT or "",
            region=settings.CHECKPOINT_STORE_REGION or "",
            access_key=settings.CHECKPOINT_STORE_ACCESS_KEY_ID or "",
            secret_key=settings.CHECKPOINT_STORE_SECRET_ACCESS_KEY or "",
        )
    raise ImproperlyConfigured("CHECKPOINT_STORE_URL is s3://bucket/prefix or file:///folder")


@functools.cache
def checkpoint_store() -> CheckpointStore:
    """The installation's store (one client per process)."""
    return store_from_url(settings.CHECKPOINT_STORE_URL)


@receiver(setting_changed)
def _forget_store(*, setting: str, **kwargs) -> None:
    if setting.startswith("CHECKPOINT_STORE"):
        checkpoint_store.cache_clear()


def job_checkpoint_environment(
    *, tenant_id: int, job_id: int, resume_from: str, mounted_at: str | None = None
) -> dict[str, str]:
    """What every backend hands a job about checkpoints: its own prefix's URL (plus what
    reaches it), where to post its `checkpoint` events and, when this start continues
    from a checkpoint, that manifest's URL, which lies under the same prefix."""
    env = checkpoint_store().job_environment(
        job_prefix(tenant_id=tenant_id, job_id=job_id),
        mounted_at=mounted_at,
        renewal=checkpoint_credentials_environment(tenant_id=tenant_id, job_id=job_id),
    )
    env.update(checkpoint_event_environment(tenant_id=tenant_id, job_id=job_id))
    env["GPUGEEK_RESUME_FROM"] = (
        f"{env['GPUGEEK_CHECKPOINT_URL'].rstrip('/')}/{resume_from}" if resume_from else ""
    )
    return env
