"""The simulated workload's checkpoints in the console's real checkpoint store.

When a pod is given GPUGEEK_CHECKPOINT_URL (its job's own prefix, `file:///…/` or
`s3://bucket/…/`), rank 0 writes each checkpoint in the protocol the console reads:
the files of `<prefix><step>/` first, the manifest `gpugeek-checkpoint.json` (step,
time, files with sizes, metrics) last. A resumed pod reads the step to continue from in
the manifest GPUGEEK_RESUME_FROM names. The format is written here rather than through
the SDK so that the sandbox stays a program of its own; S3 needs boto3 (the console's
environment has it), with the credentials and endpoint from the pod's environment (its
keys, or the console's URL that renews its temporary ones).
After each manifest rank 0 posts the job's `checkpoint` event, as the SDK's helper does,
when the pod was given GPUGEEK_CHECKPOINT_NOTIFY_URL and its token.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MANIFEST_NAME = "gpugeek-checkpoint.json"


def _s3_client(env: dict[str, str]) -> Any:
    """An S3 client with the pod's credentials: its keys, or the console's renewal URL
    (AWS_CONTAINER_CREDENTIALS_FULL_URI), read from the pod's environment, never from
    the sandbox's own as a default client would."""
    import boto3  # only an S3 store needs them
    import botocore.session
    from botocore.credentials import ContainerProvider, CredentialResolver, EnvProvider

    session = botocore.session.get_session()
    session.register_component(
        "credential_provider",
        CredentialResolver([EnvProvider(environ=env), ContainerProvider(environ=env)]),
    )
    return boto3.Session(botocore_session=session).client(
        "s3",
        endpoint_url=env.get("AWS_ENDPOINT_URL") or None,
        region_name=env.get("AWS_DEFAULT_REGION") or None,
    )


class _Store:
    def __init__(self, url: str, env: dict[str, str]):
        parts = urlsplit(url)
        self.scheme = parts.scheme
        self.path = parts.path if parts.path.endswith("/") else parts.path + "/"
        self.bucket = parts.netloc
        self.client: Any = None
        if self.scheme == "s3":
            self.client = _s3_client(env)
        elif self.scheme != "file":
            raise ValueError(f"not a checkpoint store URL: {url!r}")

    def put(self, key: str, data: bytes) -> None:
        if self.client is not None:
            self.client.put_object(Bucket=self.bucket, Key=self.path.lstrip("/") + key, Body=data)
            return
        target = Path(self.path) / key
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".part")
        partial.write_bytes(data)
        os.replace(partial, target)  # a reader sees the whole file or none

    def get(self, key: str) -> bytes:
        if self.client is not None:
            answer = self.client.get_object(Bucket=self.bucket, Key=self.path.lstrip("/") + key)
            return answer["Body"].read()
        return (Path(self.path) / key).read_bytes()


def save(url: str, env: dict[str, str], *, step: int, rank: int, loss: float) -> str:
    """Write one small checkpoint for `step`, manifest last; returns the manifest's URL."""
    store = _Store(url, env)
    state = json.dumps({"step": step, "rank": rank, "simulated": True}).encode()
    files = {"model.pt": state, "optimizer.pt": state * 2}
    for name, data in files.items():
        store.put(f"{step}/{name}", data)
    manifest = {
        "step": step,
        "time": datetime.now(UTC).isoformat(),
        "files": [{"path": name, "size": len(data)} for name, data in files.items()],
        "metrics": {"loss": round(loss, 4)},
    }
    store.put(f"{step}/{MANIFEST_NAME}", json.dumps(manifest).encode())
    return f"{url.rstrip('/')}/{step}/{MANIFEST_NAME}"


def resume_step(manifest_url: str, env: dict[str, str]) -> int | None:
    """The step in the manifest a resumed pod was told to continue from (None: none
    given, or it can't be read)."""
    if not manifest_url.endswith("/" + MANIFEST_NAME):
        return None
    folder = manifest_url[: -len(MANIFEST_NAME)]
    try:
        return int(json.loads(_Store(folder, env).get(MANIFEST_NAME))["step"])
    except Exception:  # a missing or damaged manifest: the in-memory step is used instead
        return None


def notify(env: dict[str, str], *, step: int, timeout: float = 2.0) -> str:
    """Post the `checkpoint` event with the pod's own token; what to log ("" when the pod
    got no event URL). Only a hint, as in the SDK: a failure never stops training."""
    url = env.get("GPUGEEK_CHECKPOINT_NOTIFY_URL", "")
    token = env.get("GPUGEEK_CHECKPOINT_TOKEN", "")
    if not url or not token:
        return ""
    import httpx  # only a pod with an event URL needs it

    try:
        answer = httpx.post(
            url,
            json={"step": step},
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
        )
    except httpx.HTTPError as error:
        return f"step {step}: checkpoint event not sent: {type(error).__name__}"
    if answer.status_code != 200:
        return f"step {step}: checkpoint event not taken (HTTP {answer.status_code})"
    return f"checkpoint event: the console recorded step {answer.json().get('step')}"
