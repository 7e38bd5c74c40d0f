"""The HTTP layer: auth, retries with backoff, idempotency keys, page following."""

from __future__ import annotations

import json as jsonlib
import os
import random
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx

from gpugeek.errors import ConnectionFailed, error_for

RETRY_STATUSES = frozenset({502, 503, 504})
USER_AGENT = "gpugeek-python/0.1"
NDJSON = "application/x-ndjson"


class Transport:
    """Sends requests to `<url>/api/v1/…` with a bearer token.

    502/503/504 and connection errors are retried `retries` times with exponential
    backoff (plus jitter). A POST is retried too: it carries an `Idempotency-Key`, the
    same on every attempt, so the server creates one object."""

    def __init__(
        self,
        url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        retries: int = 4,
        backoff: float = 0.25,
        max_backoff: float = 8.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.url = url.rstrip("/")
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self.http.close()

    def _path(self, path: str) -> str:
        if path.startswith(("http://", "https://")):
            return path
        return "/api/v1/" + path.lstrip("/")

    def _sleep(self, attempt: int) -> None:
        delay = min(self.max_backoff, self.backoff * (2**attempt))
        time.sleep(delay * (0.5 + random.random() / 2))  # noqa: S311 (jitter)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict | None = None,
        json: Any = None,
        idempotency_key: str | None = None,
    ) -> Any:
        headers = {}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        url = self._path(path)
        attempt = 0
        while True:
            try:
                response = self.http.request(method, url, params=params, json=json, headers=headers)
            except httpx.TransportError as error:
                if attempt >= self.retries:
                    raise ConnectionFailed(f"cannot reach {self.url}: {error}") from error
                self._sleep(attempt)
                attempt += 1
                continue
            if response.status_code in RETRY_STATUSES and attempt < self.retries:
                self._sleep(attempt)
                attempt += 1
                continue
            return _decode(response)

    def get(self, path: str, **params: Any) -> Any:
        clean = {k: v for k, v in params.items() if v is not None}
        return self.request("GET", path, params=clean or None)

    def post(self, path: str, json: Any = None, *, create: bool = False, key: str | None = None):
        """POST; `create=True` sends an idempotency key (a fresh one unless `key`)."""
        if create and key is None:
            key = new_idempotency_key()
        return self.request("POST", path, json=json, idempotency_key=key)

    def stream(self, path: str, *, read_timeout: float, **params: Any) -> Iterator[dict]:
        """One GET of an NDJSON stream: each complete line, decoded, as it arrives.

        No retries here (the caller knows where to resume). A line cut off by a dropped
        link is never yielded: only text up to a newline counts."""
        clean = {k: v for k, v in params.items() if v is not None}
        timeout = self.http.timeout.as_dict() | {"read": read_timeout}
        try:
            with self.http.stream(
                "GET", self._path(path), params=clean or None,
                headers={"Accept": f"{NDJSON}, application/json"},
                timeout=httpx.Timeout(**timeout),
            ) as response:  # fmt: skip
                if response.status_code >= 400:
                    response.read()
                    _decode(response)
                pending = b""
                for chunk in response.iter_bytes():
                    *complete, pending = (pending + chunk).split(b"\n")
                    for line in complete:
                        if line.strip():
                            yield _ndjson_object(line)
        except httpx.TransportError as error:
            raise ConnectionFailed(f"stream from {self.url} broke: {error!r}") from error

    def paginate(self, path: str, **params: Any) -> Iterator[dict]:
        """Every row of a list, following `next` links (page numbers or cursors)."""
        body = self.get(path, **params)
        while True:
            if isinstance(body, list):
                yield from body
                return
            yield from body.get("results", [])
            following = body.get("next")
            if not following:
                return
            body = self.request("GET", following)


def new_idempotency_key() -> str:
    return f"gg-{uuid.uuid4()}"


def _decode(response: httpx.Response) -> Any:
    try:
        body = response.json() if response.content else None
    except ValueError:
        body = response.text
    if response.status_code >= 400:
        raise error_for(response.status_code, body)
    return body


def _ndjson_object(line: bytes) -> dict:
    try:
        message = jsonlib.loads(line)
    except ValueError:
        message = None
    if not isinstance(message, dict):  # garbled on the way: resume as after a drop
        raise ConnectionFailed(f"not an NDJSON object: {line[:80]!r}")
    return message


def env_url() -> str:
    return os.environ.get("GPUGEEK_URL", "http://127.0.0.1:8000")
