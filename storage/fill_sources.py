"""What a volume fill reads: one HTTP(S) URL (one file) or an object-store prefix (each
object under it), streamed in chunks, with the total size when it is known up front.

SSRF: the copy runs in the console's worker, inside the console's network, so a source
naming localhost, the cloud metadata address (169.254.169.254) or a private service
would let a tenant read what only the console can reach. Every host (and each redirect's)
is resolved and refused when any of its addresses is loopback, link-local, private,
reserved, multicast or unspecified, unless VOLUME_FILL_ALLOW_PRIVATE_HOSTS says that
this installation's data lives on its private network (tests set it for 127.0.0.1). An
HTTP request then connects to the address checked (Host and TLS name kept), so a second
DNS answer can't swap in a private address between the check and the connection."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from dataclasses import dataclass, field
from posixpath import normpath
from urllib.parse import unquote, urlsplit, urlunsplit

import boto3
import httpx
from botocore import UNSIGNED
from botocore.config import Config as BotoConfig
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

CHUNK_BYTES = 1 << 20
MAX_REDIRECTS = 5
TIMEOUT_SECONDS = 30.0


class FillError(Exception):
    """Why a fill can't go on, in words for the tenant."""


@dataclass(frozen=True)
class FillSource:
    """A parsed source: scheme http/https/s3, and for s3 the bucket and prefix."""

    url: str
    scheme: str
    bucket: str = ""
    prefix: str = ""
    endpoint: str = ""


def parse_source(source: str, *, endpoint: str = "") -> FillSource:
    """The source as given by the tenant, checked for shape (not reached yet)."""
    if not isinstance(source, str) or not source.strip():
        raise FillError("Give a source: an http(s):// URL or s3://bucket/prefix.")
    source = source.strip()
    parts = urlsplit(source)
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise FillError("The URL has no host.")
        if endpoint:
            raise FillError("An endpoint is only for s3:// sources.")
        return FillSource(url=source, scheme=parts.scheme)
    if parts.scheme == "s3":
        if not parts.netloc:
            raise FillError("Write an object-store source as s3://bucket/prefix.")
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise FillError("The endpoint is an http(s):// URL, e.g. https://minio.example.com.")
        if endpoint and not urlsplit(endpoint).hostname:
            raise FillError("The endpoint has no host.")
        return FillSource(
            url=source,
            scheme="s3",
            bucket=parts.netloc,
            prefix=parts.path.lstrip("/"),
            endpoint=endpoint.rstrip("/"),
        )
    raise FillError("The source is an http://, https:// or s3:// URL.")


def _public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (
        ip.is_loopback
        or ip.is_link_local
        or ip.is_private
        or ip.is_reserved
        or ip.is_multicast
        or ip.is_unspecified
    )


def resolve_public_host(host: str, port: int) -> str:
    """An address of `host` to connect to, after checking every address it resolves to
    (see the module's note on SSRF); FillError when one is not public."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:
        raise FillError(f"Can't resolve {host}: {error}.") from None
    addresses = [info[4][0] for info in infos]
    if not addresses:
        raise FillError(f"Can't resolve {host}.")
    if not settings.VOLUME_FILL_ALLOW_PRIVATE_HOSTS:
        refused = sorted({a for a in addresses if not _public(a)})
        if refused:
            raise FillError(
                f"{host} resolves to {', '.join(refused)}, a loopback, link-local or private "
                "address: the console doesn't fetch from its own network."
            )
    return addresses[0]


def check_reachable(source: FillSource) -> None:
    """Refuse at once a source whose host isn't public (the copy checks again)."""
    url = source.endpoint if source.scheme == "s3" else source.url
    if url:
        parts = urlsplit(url)
        resolve_public_host(parts.hostname or "", parts.port or _default_port(parts.scheme))


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80


def safe_relative_path(name: str) -> str:
    """`name` as a path inside the volume; FillError for one that leaves it."""
    path = normpath(name.replace("\\", "/")).lstrip("/")
    if not path or path == "." or path.startswith("../") or path == ".." or "\x00" in path:
        raise FillError(f"Refusing to write {name!r}: it is not a path inside the volume.")
    return path


@dataclass
class OpenSource:
    """An opened source: `total` bytes when known, and its files as (path, chunks)."""

    total: int | None
    files: Iterator[tuple[str, Iterator[bytes]]]
    _closers: list = field(default_factory=list)

    def close(self) -> None:
        for close in self._closers:
            close()


def _pinned_request(client: httpx.Client, url: str, headers: dict) -> httpx.Response:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or _default_port(parts.scheme)
    address = resolve_public_host(host, port)
    netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
    request = client.build_request(
        "GET",
        urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")),
        headers={**headers, "Host": parts.netloc.rsplit("@", 1)[-1]},
        extensions={"sni_hostname": host} if parts.scheme == "https" else {},
    )
    return client.send(request, stream=True)


def _http_open(source: FillSource, token: str) -> OpenSource:
    client = httpx.Client(timeout=TIMEOUT_SECONDS, follow_redirects=False)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = source.url
    try:
        for _ in range(MAX_REDIRECTS + 1):
            response = _pinned_request(client, url, headers)
            if not response.is_redirect:
                break
            response.close()
            location = response.headers.get("location", "")
            url = str(httpx.URL(url).join(location))
            if urlsplit(url).scheme not in ("http", "https"):
                raise FillError(f"The URL redirects to {url}, which is not http(s).")
            headers = {}  # a token is for the host it was given for
        else:
            raise FillError(f"More than {MAX_REDIRECTS} redirects.")
    except httpx.HTTPError as error:
        client.close()
        raise FillError(f"Can't fetch {url}: {error}.") from None
    except FillError:
        client.close()
        raise
    if response.status_code != 200:
        response.close()
        client.close()
        raise FillError(f"{url} answered HTTP {response.status_code}.")
    length = response.headers.get("content-length", "")
    name = unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or "download"

    def chunks() -> Iterator[bytes]:
        try:
            yield from response.iter_bytes(CHUNK_BYTES)
        except httpx.HTTPError as error:
            raise FillError(f"The download from {url} broke off: {error}.") from None

    return OpenSource(
        total=int(length) if length.isdigit() else None,
        files=iter([(safe_relative_path(name), chunks())]),
        _closers=[response.close, client.close],
    )


def _s3_open(source: FillSource, credential: str) -> OpenSource:
    check_reachable(source)
    key_id, _, secret_key = credential.partition(":") if credential else ("", "", "")
    if credential and not (key_id and secret_key):
        raise FillError("The secret holds S3 credentials as ACCESS_KEY_ID:SECRET_ACCESS_KEY.")
    client = boto3.client(
        "s3",
        endpoint_url=source.endpoint or None,
        aws_access_key_id=key_id or None,
        aws_secret_access_key=secret_key or None,
        region_name=settings.VOLUME_FILL_S3_REGION,
        config=BotoConfig(
            connect_timeout=TIMEOUT_SECONDS,
            read_timeout=TIMEOUT_SECONDS,
            retries={"max_attempts": 3},
            signature_version=None if credential else UNSIGNED,
        ),
    )
    if not source.endpoint:  # AWS's own endpoint: check the address it really uses
        check_reachable(FillSource(url="", scheme="s3", endpoint=client.meta.endpoint_url))
    objects: list[tuple[str, str, int]] = []
    base = source.prefix if source.prefix.endswith("/") else source.prefix.rpartition("/")[0]
    base = base + "/" if base and not base.endswith("/") else base
    try:
        pages = client.get_paginator("list_objects_v2").paginate(
            Bucket=source.bucket, Prefix=source.prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                if item["Key"].endswith("/"):
                    continue  # a "folder" marker object
                # s3://b/data/ copies what is under data/; s3://b/data keeps the
                # last part of the name (data/a.csv, data.csv), as rsync does.
                relative = item["Key"][len(base) :]
                objects.append((item["Key"], safe_relative_path(relative), int(item["Size"])))
    except (BotoCoreError, ClientError) as error:
        raise FillError(f"Can't list {source.url}: {error}.") from None
    if not objects:
        raise FillError(f"Nothing found under {source.url}.")

    def files() -> Iterator[tuple[str, Iterator[bytes]]]:
        for key, relative, _size in objects:
            yield relative, _object_chunks(client, source.bucket, key)

    return OpenSource(total=sum(size for _, _, size in objects), files=files())


def _object_chunks(client, bucket: str, key: str) -> Iterator[bytes]:
    try:
        body = client.get_object(Bucket=bucket, Key=key)["Body"]
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()
    except (BotoCoreError, ClientError) as error:
        raise FillError(f"Can't read s3://{bucket}/{key}: {error}.") from None


def open_source(source: FillSource, *, credential: str = "") -> OpenSource:
    """Open `source` for reading (FillError when it can't be)."""
    if source.scheme == "s3":
        return _s3_open(source, credential)
    return _http_open(source, credential)
