"""Save and find checkpoints in the GpuGeek checkpoint store, from inside a job.

The console gives every job its own store prefix as GPUGEEK_CHECKPOINT_URL
(`file:///…/` or `s3://bucket/…/`, with AWS_* for S3) and, when an attempt continues
earlier work, GPUGEEK_RESUME_FROM: the manifest URL of the checkpoint to load.

The protocol: a checkpoint is the folder `<prefix><step>/`; its files are uploaded first
and the manifest `<prefix><step>/gpugeek-checkpoint.json` (step, time, files with sizes,
optional metrics) last, so a checkpoint cut off half-way (a preemption mid-upload) has
no manifest, or one listing files that aren't there, and is never offered for resume.

    from gpugeek import checkpoint
    if (found := checkpoint.latest()) is not None:
        state = torch.load(found.fetch("/tmp/resume") / "model.pt")
    ...
    torch.save(state, "/tmp/ckpt/model.pt")
    checkpoint.save("/tmp/ckpt", step=step, metrics={"loss": loss})

S3 needs boto3 (`pip install 'gpugeek[checkpoint]'`); large files go up in parts. After
each manifest the helper posts a `checkpoint` event to the console (when it was given
GPUGEEK_CHECKPOINT_NOTIFY_URL and the job's token), which records it and prunes the job's
older checkpoints at once.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import httpx

MANIFEST_NAME = "gpugeek-checkpoint.json"
_STEP = re.compile(r"\d{1,18}")

PathOrFiles = str | os.PathLike | Iterable[str | os.PathLike]


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its manifest read and every listed file found."""

    step: int
    time: datetime
    files: dict[str, int]  # path relative to the checkpoint's folder -> size in bytes
    manifest_url: str
    metrics: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        """The checkpoint's folder (the manifest's URL without its name)."""
        return self.manifest_url[: -len(MANIFEST_NAME)]

    def fetch(self, destination: str | os.PathLike) -> Path:
        """The checkpoint's files under `destination` (downloaded from S3; copied from a
        folder store), laid out as they were saved; returns `destination`."""
        target = Path(destination)
        store = _store(self.url)
        for name in self.files:
            store.download(name, target / name)
        return target


def _checked_name(name: str) -> str:
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or any(p in ("..", ".", "") for p in name.split("/")):
        raise ValueError(f"{name!r} is not a path inside the checkpoint")
    return str(pure)


def _collect(path_or_files: PathOrFiles) -> list[tuple[Path, str]]:
    """(local file, name in the checkpoint): a folder's files keep their relative paths,
    single files their names."""
    if isinstance(path_or_files, (str, os.PathLike)):
        items = [Path(path_or_files)]
    else:
        items = [Path(item) for item in path_or_files]
    collected: list[tuple[Path, str]] = []
    for item in items:
        if item.is_dir():
            for file in sorted(p for p in item.rglob("*") if p.is_file()):
                collected.append((file, file.relative_to(item).as_posix()))
        elif item.is_file():
            collected.append((item, item.name))
        else:
            raise FileNotFoundError(item)
    names = [name for _, name in collected]
    if len(set(names)) != len(names):
        raise ValueError("two files would have the same name in the checkpoint")
    if MANIFEST_NAME in names:
        raise ValueError(f"{MANIFEST_NAME} is the manifest's name")
    return collected


class _FolderStore:
    def __init__(self, root: Path):
        self.root = root

    def url(self, key: str) -> str:
        return f"file://{self.root / key}"

    def upload(self, local: Path, key: str) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, target)

    def put_last(self, key: str, data: bytes) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        # Renamed into place: a reader sees no manifest or a whole one.
        with tempfile.NamedTemporaryFile(dir=target.parent, delete=False) as handle:
            handle.write(data)
        os.replace(handle.name, target)

    def sizes(self) -> dict[str, int]:
        if not self.root.is_dir():
            return {}
        return {
            path.relative_to(self.root).as_posix(): path.stat().st_size
            for path in self.root.rglob("*")
            if path.is_file() and not path.is_symlink()
        }

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def download(self, key: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.root / key, target)


class _S3Store:
    def __init__(self, bucket: str, prefix: str):
        try:
            import boto3  # optional: only an S3 store needs it
        except ImportError as error:  # pragma: no cover - depends on the install
            raise RuntimeError(
                "an s3:// checkpoint store needs boto3: pip install boto3"
            ) from error
        self.bucket, self.prefix = bucket, prefix
        # AWS_ENDPOINT_URL, AWS_DEFAULT_REGION and the keys come from the job's environment.
        self.client = boto3.client("s3")

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{key}"

    def upload(self, local: Path, key: str) -> None:
        # upload_file switches to a multipart upload above its threshold (8 MiB).
        self.client.upload_file(str(local), self.bucket, self.prefix + key)

    def put_last(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=self.prefix + key, Body=data)

    def sizes(self) -> dict[str, int]:
        listing = {}
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                listing[item["Key"][len(self.prefix) :]] = int(item["Size"])
        return listing

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()

    def download(self, key: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        self.client.download_file(self.bucket, self.prefix + key, str(target))


def _store(url: str) -> _FolderStore | _S3Store:
    parts = urlsplit(url)
    path = parts.path if parts.path.endswith("/") else parts.path + "/"
    if parts.scheme == "file":
        return _FolderStore(Path(path))
    if parts.scheme == "s3":
        return _S3Store(parts.netloc, path.lstrip("/"))
    raise ValueError(f"not a checkpoint store URL: {url!r}")


def _base_url(url: str | None) -> str:
    url = url or os.environ.get("GPUGEEK_CHECKPOINT_URL", "")
    if not url:
        raise RuntimeError("no checkpoint store: GPUGEEK_CHECKPOINT_URL is not set")
    return url if url.endswith("/") else url + "/"


def save(
    path_or_files: PathOrFiles,
    *,
    step: int,
    metrics: dict[str, Any] | None = None,
    url: str | None = None,
) -> str:
    """Upload a checkpoint (a folder, a file or a list of them) for `step`: the files
    first, the manifest last. Returns the manifest's URL."""
    step = int(step)
    if step < 0:
        raise ValueError("step must be 0 or more")
    store = _store(_base_url(url))
    files = _collect(path_or_files)
    listed = []
    for local, name in files:
        name = _checked_name(name)
        size = local.stat().st_size
        store.upload(local, f"{step}/{name}")
        listed.append({"path": name, "size": size})
    manifest = {
        "step": step,
        "time": datetime.now(timezone.utc).isoformat(),  # noqa: UP017  (Python 3.10)
        "files": listed,
        "metrics": metrics or {},
    }
    key = f"{step}/{MANIFEST_NAME}"
    store.put_last(key, json.dumps(manifest, sort_keys=True).encode())
    notify(step=step)
    return store.url(key)


def notify(*, step: int | None = None, timeout: float = 5.0) -> bool:
    """Post the `checkpoint` event (GPUGEEK_CHECKPOINT_NOTIFY_URL, with the job's own
    GPUGEEK_CHECKPOINT_TOKEN) so the console records the new checkpoint and prunes old
    ones now rather than at its next scan. Only a hint: the console lists the store
    itself, and a failure here never fails the save. True when the console took it."""
    url = os.environ.get("GPUGEEK_CHECKPOINT_NOTIFY_URL", "")
    token = os.environ.get("GPUGEEK_CHECKPOINT_TOKEN", "")
    if not url or not token:
        return False
    try:
        answer = httpx.post(
            url,
            json={"step": step},
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )
    except httpx.HTTPError:
        return False
    return answer.status_code == 200


def checkpoints(url: str | None = None) -> list[Checkpoint]:
    """The complete checkpoints under the prefix, oldest step first."""
    store = _store(_base_url(url))
    listing = store.sizes()
    found = []
    for key in listing:
        step_text, _, name = key.partition("/")
        if name != MANIFEST_NAME or not _STEP.fullmatch(step_text):
            continue
        try:
            data = json.loads(store.read(key))
            files = {_checked_name(e["path"]): int(e["size"]) for e in data["files"]}
            time = datetime.fromisoformat(str(data["time"]))
            if int(data["step"]) != int(step_text):
                continue
        except (ValueError, KeyError, TypeError, OSError):
            continue
        if all(listing.get(f"{step_text}/{name}") == size for name, size in files.items()):
            found.append(
                Checkpoint(
                    step=int(step_text),
                    time=time,
                    files=files,
                    manifest_url=store.url(key),
                    metrics=data.get("metrics") or {},
                )
            )
    return sorted(found, key=lambda checkpoint: checkpoint.step)


def latest(url: str | None = None) -> Checkpoint | None:
    """The newest complete checkpoint under the prefix, or None."""
    complete = checkpoints(url)
    return complete[-1] if complete else None


def resume_from() -> Checkpoint | None:
    """The checkpoint the console told this attempt to continue from
    (GPUGEEK_RESUME_FROM), when it is still complete; else None."""
    manifest_url = os.environ.get("GPUGEEK_RESUME_FROM", "")
    if not manifest_url or not manifest_url.endswith("/" + MANIFEST_NAME):
        return None
    folder = manifest_url[: -len(MANIFEST_NAME)]
    prefix = folder.rstrip("/").rsplit("/", 1)[0] + "/"
    return next((c for c in checkpoints(prefix) if c.manifest_url == manifest_url), None)
