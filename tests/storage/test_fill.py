"""Filling a volume from an HTTP(S) URL or an object-store prefix, through the real
protocols: an HTTP server on 127.0.0.1 started here, and moto's S3 server over HTTP
through boto3. The copy runs the worker's service directly (without Celery)."""

from __future__ import annotations

import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from console.service_errors import ErrorCode, ServiceError
from jobs.backends.local_volumes import volume_folder
from jobs.models import JobStatus
from jobs.services.secrets import tenant_secret_set
from storage import services
from storage.fill_copy import GIB, STAGING_PREFIX, FillCancelled, copy_into
from storage.fill_sources import FillError, OpenSource, resolve_public_host, safe_relative_path
from storage.models import FillStatus, VolumeFill
from tests.conftest import signed_in_client, token_client
from tests.factories import VolumeFactory
from tests.jobs_helpers import advance_to, submit

pytestmark = pytest.mark.django_db

PAYLOAD = b"0123456789" * 5000  # 50,000 bytes


class Handler(BaseHTTPRequestHandler):
    """/data.bin: PAYLOAD with its length; /stream.bin: PAYLOAD × `repeat` without a
    length (HTTP/1.0, ends when the connection closes); /secret.bin: needs the token;
    /moved: a redirect to /data.bin; anything else 404."""

    repeat = 1

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        if self.path == "/moved":
            self.send_response(302)
            self.send_header("Location", "/data.bin")
            self.end_headers()
        elif self.path == "/data.bin" or (
            self.path == "/secret.bin" and self.headers.get("Authorization") == "Bearer s3cr3t"
        ):
            self.send_response(200)
            self.send_header("Content-Length", str(len(PAYLOAD)))
            self.end_headers()
            self.wfile.write(PAYLOAD)
        elif self.path == "/stream.bin":
            self.send_response(200)
            self.end_headers()
            for _ in range(type(self).repeat):
                self.wfile.write(PAYLOAD)
        else:
            self.send_response(404)
            self.end_headers()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def http_base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def s3_endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_endpoint):
    """A fresh bucket with data/a.csv, data/sub/b.csv, data.txt and other/c.csv."""
    name = f"datasets-{_free_port()}"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        aws_access_key_id="tenant-key",
        aws_secret_access_key="tenant-secret",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=name)
    for key, body in {
        "data/a.csv": b"a" * 1000,
        "data/sub/b.csv": b"b" * 2500,
        "data.txt": b"t",
        "other/c.csv": b"c",
    }.items():
        client.put_object(Bucket=name, Key=key, Body=body)
    return client, name


def folder_of(volume) -> Path:
    return volume_folder(tenant_id=volume.tenant_id, volume_id=volume.pk)


def run_queued(fill: VolumeFill) -> None:
    """What the worker does with the message the start queued."""
    services.volume_fill_run(fill_id=fill.pk, attempt=0)


def fill_and_run(volume, user, **values) -> VolumeFill:
    fill = services.volume_fill_start(volume=volume, user=user, **values)
    run_queued(fill)
    fill.refresh_from_db()
    return fill


def test_an_http_fill_copies_the_file_and_reports_progress(
    world, catalog, fill_settings, http_base
):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    fill = fill_and_run(volume, world.member, source=f"{http_base}/data.bin")
    assert fill.status == FillStatus.SUCCEEDED, fill.error
    assert (fill.bytes_done, fill.bytes_total, fill.files_done) == (len(PAYLOAD), len(PAYLOAD), 1)
    assert fill.started_at <= fill.finished_at and fill.error == ""
    folder = folder_of(volume)
    assert (folder / "data.bin").read_bytes() == PAYLOAD
    assert not [p for p in folder.iterdir() if p.name.startswith(STAGING_PREFIX)]


def test_a_redirect_is_followed_and_a_token_is_sent(world, catalog, fill_settings, http_base):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    assert fill_and_run(volume, world.member, source=f"{http_base}/moved").status == "succeeded"
    assert (folder_of(volume) / "data.bin").read_bytes() == PAYLOAD
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="DL_TOKEN", value="s3cr3t")
    fill = fill_and_run(volume, world.owner, source=f"{http_base}/secret.bin", secret="DL_TOKEN")
    assert fill.status == FillStatus.SUCCEEDED, fill.error
    missing = fill_and_run(volume, world.owner, source=f"{http_base}/secret.bin")
    assert missing.status == FillStatus.FAILED and "HTTP 404" in missing.error


def _nearly_full(volume, free_bytes: int) -> None:
    """A sparse file that leaves `free_bytes` of the volume's size (no disk used)."""
    folder = folder_of(volume)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "big.img", "wb") as big:
        big.truncate(volume.size_gib * GIB - free_bytes)


def test_a_known_size_that_doesnt_fit_fails_before_copying(
    world, catalog, fill_settings, http_base
):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    _nearly_full(volume, 1000)
    fill = fill_and_run(volume, world.member, source=f"{http_base}/data.bin")
    assert fill.status == FillStatus.FAILED and fill.bytes_done == 0
    assert "Grow the volume" in fill.error and "1,000 bytes free" in fill.error
    assert sorted(p.name for p in folder_of(volume).iterdir()) == ["big.img"]


def test_a_stream_of_unknown_size_stops_when_the_volume_is_full(
    world, catalog, fill_settings, http_base
):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    _nearly_full(volume, 120_000)
    Handler.repeat = 3  # 150,000 bytes, no Content-Length
    try:
        fill = fill_and_run(volume, world.member, source=f"{http_base}/stream.bin")
    finally:
        Handler.repeat = 1
    assert fill.status == FillStatus.FAILED and "The volume is full" in fill.error
    assert fill.bytes_total is None
    # Nothing half-copied is left, and nothing is flagged as complete.
    assert sorted(p.name for p in folder_of(volume).iterdir()) == ["big.img"]
    fits = fill_and_run(volume, world.member, source=f"{http_base}/stream.bin")
    assert fits.status == FillStatus.SUCCEEDED and fits.bytes_total is None
    assert (folder_of(volume) / "stream.bin").stat().st_size == len(PAYLOAD)


def test_an_s3_prefix_fill_copies_every_object_under_it(world, catalog, fill_settings, bucket):
    client, name = bucket
    tenant_secret_set(
        tenant=world.tenant, user=world.owner, name="S3", value="tenant-key:tenant-secret"
    )
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    endpoint = client.meta.endpoint_url
    fill = fill_and_run(
        volume, world.owner, source=f"s3://{name}/data/", endpoint=endpoint, secret="S3"
    )
    assert fill.status == FillStatus.SUCCEEDED, fill.error
    assert (fill.bytes_done, fill.bytes_total, fill.files_done) == (3500, 3500, 2)
    folder = folder_of(volume)
    assert (folder / "a.csv").read_bytes() == b"a" * 1000
    assert (folder / "sub" / "b.csv").read_bytes() == b"b" * 2500
    # Without the trailing slash the prefix's last part is kept, as rsync does.
    again = fill_and_run(
        volume, world.owner, source=f"s3://{name}/data", endpoint=endpoint, secret="S3"
    )
    assert again.status == FillStatus.SUCCEEDED and again.files_done == 3, again.error
    assert (folder / "data" / "sub" / "b.csv").exists() and (folder / "data.txt").exists()


def test_an_s3_failure_says_why_and_writes_nothing(world, catalog, fill_settings, bucket):
    client, name = bucket
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    endpoint = client.meta.endpoint_url
    fill = fill_and_run(volume, world.member, source="s3://no-such-bucket/x", endpoint=endpoint)
    assert fill.status == FillStatus.FAILED and "NoSuchBucket" in fill.error
    empty = fill_and_run(volume, world.member, source=f"s3://{name}/nothing/", endpoint=endpoint)
    assert empty.status == FillStatus.FAILED and "Nothing found" in empty.error
    assert not folder_of(volume).exists() or not any(folder_of(volume).iterdir())


def test_a_key_leaving_the_volume_or_a_planted_link_is_refused(
    world, catalog, fill_settings, bucket, tmp_path
):
    client, name = bucket
    endpoint = client.meta.endpoint_url
    client.put_object(Bucket=name, Key="evil/../../escape.txt", Body=b"x")
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    fill = fill_and_run(volume, world.member, source=f"s3://{name}/evil/", endpoint=endpoint)
    assert fill.status == FillStatus.FAILED and "not a path inside the volume" in fill.error
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, folder_of(volume) / "sub")  # as a job could have left it
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="S3", value="k:s")
    linked = fill_and_run(
        volume, world.owner, source=f"s3://{name}/data/", endpoint=endpoint, secret="S3"
    )
    assert linked.status == FillStatus.FAILED and "leaves the volume" in linked.error
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("name", ["../x", "..", "/", "a/../../b", "./", "a\x00b"])
def test_unsafe_relative_paths_are_refused(name):
    with pytest.raises(FillError):
        safe_relative_path(name)
    assert safe_relative_path("/a/b/../c.csv") == "a/c.csv"


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "169.254.169.254", "10.1.2.3", "192.168.0.1", "::1",
             "::ffff:127.0.0.1", "0.0.0.0"]
)  # fmt: skip
def test_private_hosts_are_refused_unless_allowed(settings, host):
    # SSRF: the copy runs inside the console's network.
    settings.VOLUME_FILL_ALLOW_PRIVATE_HOSTS = False
    with pytest.raises(FillError, match="loopback, link-local or private"):
        resolve_public_host(host, 80)
    settings.VOLUME_FILL_ALLOW_PRIVATE_HOSTS = True
    assert resolve_public_host(host, 80)


def test_a_fill_from_the_consoles_network_is_refused(world, catalog, settings, http_base):
    settings.VOLUME_FILL_ALLOW_PRIVATE_HOSTS = False
    volume = VolumeFactory(tenant=world.tenant, name="data")
    for source, endpoint in [
        (f"{http_base}/data.bin", ""),
        ("http://169.254.169.254/latest/meta-data/", ""),
        ("s3://bucket/prefix", "http://127.0.0.1:9000"),
    ]:
        with pytest.raises(ServiceError) as refused:
            services.volume_fill_start(
                volume=volume, user=world.member, source=source, endpoint=endpoint
            )
        assert refused.value.field == "source" and "private" in refused.value.message
    assert not VolumeFill.objects.exists()


@pytest.mark.parametrize(
    ("source", "endpoint", "words"),
    [
        ("ftp://example.com/x", "", "http://, https:// or s3://"),
        ("s3:///prefix", "", "s3://bucket/prefix"),
        ("https://example.com/x", "https://minio", "only for s3://"),
        ("s3://b/p", "minio:9000", "endpoint is an http(s)"),
        ("   ", "", "Give a source"),
    ],
)
def test_a_bad_source_is_a_field_error(world, catalog, source, endpoint, words):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    with pytest.raises(ServiceError, match=words.replace("(", r"\(").replace(")", r"\)")):
        services.volume_fill_start(
            volume=volume, user=world.member, source=source, endpoint=endpoint
        )


def test_one_fill_at_a_time_and_not_under_a_writer(world, catalog, fill_settings, http_base):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    first = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/data.bin"
    )
    with pytest.raises(ServiceError) as busy:
        services.volume_fill_start(volume=volume, user=world.member, source=f"{http_base}/x")
    assert busy.value.code == ErrorCode.CONFLICT and "being filled" in busy.value.message
    # A job can't mount it read-write meanwhile (it may read-only).
    with pytest.raises(ServiceError) as launch:
        submit(world, "writer", volumes=[{"name": "data", "path": "/data"}])
    assert launch.value.code == ErrorCode.CONFLICT and "being filled" in launch.value.message
    services.volume_fill_cancel(volume=volume, user=world.member)
    first.refresh_from_db()
    assert first.status == FillStatus.CANCELLED and "Cancelled by" in first.error
    run_queued(first)  # a queued task arriving late does nothing
    first.refresh_from_db()
    assert first.status == FillStatus.CANCELLED and not folder_of(volume).exists()
    job = submit(world, "writer", volumes=[{"name": "data", "path": "/data"}])
    with pytest.raises(ServiceError) as held:
        services.volume_fill_start(volume=volume, user=world.member, source=f"{http_base}/x")
    assert held.value.code == ErrorCode.CONFLICT and f"job #{job.pk}" in held.value.message
    advance_to(job, JobStatus.CANCELLED)
    assert fill_and_run(volume, world.member, source=f"{http_base}/data.bin").status == "succeeded"


def test_a_cancel_during_the_copy_discards_what_was_copied(tmp_path):
    folder = tmp_path / "volume"
    folder.mkdir()
    (folder / "kept.txt").write_text("kept")
    opened = OpenSource(total=None, files=iter([("a.bin", iter([b"x" * 10] * 3))]))
    with pytest.raises(FillCancelled):
        copy_into(folder=folder, fill_id=7, size_gib=1, opened=opened, progress=lambda *a: False)
    assert sorted(p.name for p in folder.iterdir()) == ["kept.txt"]


def test_deleting_a_volume_cancels_its_fill(world, catalog, fill_settings, http_base):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    fill = services.volume_fill_start(
        volume=volume, user=world.member, source=f"{http_base}/data.bin"
    )
    services.volume_delete(volume=volume, user=world.member)
    fill.refresh_from_db()
    assert fill.status == FillStatus.CANCELLED and fill.error == "The volume was deleted."


def test_a_secret_the_user_may_not_use_is_refused(world, catalog, fill_settings, http_base):
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="ADMINS_ONLY", value="k:s")
    volume = VolumeFactory(tenant=world.tenant, name="data")
    for secret in ("ADMINS_ONLY", "NO_SUCH"):
        with pytest.raises(ServiceError) as refused:
            services.volume_fill_start(
                volume=volume, user=world.member, source=f"{http_base}/data.bin", secret=secret
            )
        assert refused.value.field == "secret"


def test_the_api_starts_a_fill_and_shows_its_progress(
    world, catalog, fill_settings, http_base, django_capture_on_commit_callbacks
):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    api = token_client(world.member, world.tenant)
    url = f"/api/v1/volumes/{volume.pk}"
    assert api.get(url).json()["fill"] is None
    with django_capture_on_commit_callbacks(execute=False) as queued:
        started = api.post(f"{url}/fill", {"source": f"{http_base}/data.bin"}, format="json")
    assert started.status_code == 202, started.content
    assert started.json()["fill"]["status"] == "queued" and len(queued) == 1
    again = api.post(f"{url}/fill", {"source": f"{http_base}/data.bin"}, format="json")
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    run_queued(VolumeFill.objects.get())
    fill = api.get(url).json()["fill"]
    assert {k: fill[k] for k in ("status", "bytes_done", "bytes_total", "files", "error")} == {
        "status": "succeeded", "bytes_done": len(PAYLOAD), "bytes_total": len(PAYLOAD),
        "files": 1, "error": "",
    }  # fmt: skip
    assert fill["started_at"] and fill["finished_at"]
    assert api.get("/api/v1/volumes").json()["results"][0]["fill"]["status"] == "succeeded"
    cancel = api.post(f"{url}/fill/cancel", format="json")
    assert cancel.status_code == 409
    bad = api.post(f"{url}/fill", {"source": 5}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid"
    bad = api.post(f"{url}/fill", {"source": "gopher://x"}, format="json")
    assert bad.status_code == 400 and "source" in str(bad.json())


def test_the_api_cancels_a_fill(world, catalog, fill_settings, http_base):
    volume = VolumeFactory(tenant=world.tenant, name="data")
    api = token_client(world.member, world.tenant)
    url = f"/api/v1/volumes/{volume.pk}"
    assert api.post(f"{url}/fill", {"source": f"{http_base}/d"}, format="json").status_code == 202
    cancelled = api.post(f"{url}/fill/cancel", format="json")
    assert cancelled.status_code == 200 and cancelled.json()["fill"]["status"] == "cancelled"
    assert "Cancelled by" in cancelled.json()["fill"]["error"]


def test_another_tenants_volume_fill_is_404_and_a_viewer_is_403(
    world, other_world, catalog, fill_settings, http_base
):
    theirs = VolumeFactory(tenant=other_world.tenant, name="theirs")
    api = token_client(world.owner, world.tenant)
    body = {"source": f"{http_base}/data.bin"}
    assert api.post(f"/api/v1/volumes/{theirs.pk}/fill", body, format="json").status_code == 404
    assert api.post(f"/api/v1/volumes/{theirs.pk}/fill/cancel").status_code == 404
    client = signed_in_client(world.owner, world.tenant)
    assert client.get(f"/storage/{theirs.pk}/").status_code == 404
    assert client.post(f"/storage/{theirs.pk}/", body).status_code == 404
    assert client.post(f"/storage/{theirs.pk}/fill/cancel/").status_code == 404
    assert not VolumeFill.objects.exists()
    ours = VolumeFactory(tenant=world.tenant, name="ours")
    viewer = token_client(world.viewer, world.tenant)
    assert viewer.post(f"/api/v1/volumes/{ours.pk}/fill", body, format="json").status_code == 403


def test_the_volume_page_fills_and_polls_progress(world, catalog, fill_settings, http_base):
    volume = VolumeFactory(tenant=world.tenant, name="data", size_gib=1)
    client = signed_in_client(world.member, world.tenant)
    page = client.get(f"/storage/{volume.pk}/")
    assert page.status_code == 200 and b"Never filled" in page.content
    assert f'href="/storage/{volume.pk}/"'.encode() in client.get("/storage/").content
    bad = client.post(f"/storage/{volume.pk}/", {"source": "ftp://x/y"})
    assert bad.status_code == 200 and b"s3://" in bad.content
    started = client.post(f"/storage/{volume.pk}/", {"source": f"{http_base}/data.bin"})
    assert started.status_code == 302
    queued = client.get(f"/storage/{volume.pk}/")
    assert (
        b'hx-trigger="every 2s"' in queued.content
        and b'data-fill-status="queued"' in queued.content
    )
    run_queued(VolumeFill.objects.get())
    partial = client.get(f"/storage/{volume.pk}/", headers={"HX-Request": "true"})
    assert partial.status_code == 200 and b"<h1>" not in partial.content
    assert (
        b'data-fill-status="succeeded"' in partial.content and b"hx-trigger" not in partial.content
    )
    assert b"48.8\xc2\xa0KB of 48.8\xc2\xa0KB (100 %)" in partial.content
    viewer = signed_in_client(world.viewer, world.tenant)
    assert b"Start fill" not in viewer.get(f"/storage/{volume.pk}/").content
    assert viewer.post(f"/storage/{volume.pk}/", {"source": f"{http_base}/x"}).status_code == 404
