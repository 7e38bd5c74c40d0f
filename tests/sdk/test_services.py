"""`client.services` and `gpugeek services …` against the real server (uvicorn on the
test database): create, list, get, change, scale, roll back, tokens, delete, and bad
input as the SDK raises it and the CLI exits. No worker runs here, so replicas stay as
the console recorded them; the replicas' own lifecycle is tested in tests/services."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta

import pytest
from django.utils import timezone
from gpugeek import cli_services
from gpugeek.cli_services import new_lines
from gpugeek.errors import Conflict, NotFound, ValidationError
from gpugeek.models import Service, ServiceToken
from gpugeek.services import Services

from jobs.backends import host_processes
from jobs.services import tenant_secret_set
from services.models import Service as ServiceRow
from services.models import ServiceReplica, ServiceScaleEvent
from tests.factories import VolumeFactory
from tests.sdk.test_cli import cli  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

ECHO = ["python", "-m", "http.server", "8080"]


def create(gg, name: str = "echo", **options) -> Service:
    values = {"image": "python:3.11-slim", "command": ECHO, "port": 8080, "region": "local"}
    return gg.services.create(name, **{**values, **options})


def test_a_service_is_created_changed_scaled_rolled_back_and_deleted(gg):
    service = create(gg, min_replicas=1, max_replicas=3, env={"MODEL": "small"})
    assert isinstance(service, Service) and service.revision == 1
    assert (service.name, service.region, service.auth, service.env) == (
        "echo", "local", "token", {"MODEL": "small"},
    )  # fmt: skip
    assert service.endpoint_url.startswith("http") and service.status == "deploying"
    assert [s.name for s in gg.services.list()] == ["echo"]
    assert gg.services.get(service.id).command == ECHO

    changed = gg.services.update(service.id, image="python:3.12-slim")
    assert (changed.image, changed.revision) == ("python:3.12-slim", 2)
    scaled = gg.services.scale(service.id, min_replicas=0, max_replicas=2)
    assert (scaled.min_replicas, scaled.max_replicas, scaled.revision) == (0, 2, 2)
    back = gg.services.rollback(service.id, 1)
    assert (back.image, back.revision) == ("python:3.11-slim", 3)
    revisions = gg.services.revisions(service.id)
    newest = max(revisions, key=lambda r: r.number)
    assert (newest.number, newest.copied_from, len(revisions)) == (3, 1, 3)
    assert all(r.revision >= 1 for r in gg.services.replicas(service.id))

    token = gg.services.create_token(service.id, "ci")
    assert isinstance(token, ServiceToken) and token.token and token.token.startswith(token.prefix)
    listed = gg.services.tokens(service.id)
    assert [(t.id, t.token) for t in listed] == [(token.id, None)]  # the secret shown once
    gg.services.revoke_token(service.id, token.id)
    assert gg.services.tokens(service.id)[0].revoked_at is not None

    gg.services.delete(service.id)
    with pytest.raises(NotFound):
        gg.services.get(service.id)
    assert not ServiceRow.objects.filter(pk=service.id).exists()


def test_bad_input_and_a_reused_name_are_clear_errors(gg):
    create(gg)
    with pytest.raises(Conflict):
        create(gg)
    with pytest.raises(ValidationError) as bad:
        create(gg, "other", port=70000)
    assert "port" in bad.value.errors
    with pytest.raises(ValidationError) as bad:
        create(gg, "other", min_replicas=5, max_replicas=2)
    assert "replicas" in str(bad.value).lower()
    assert [s.name for s in gg.services.list()] == ["echo"]  # nothing half-created
    public = create(gg, "open", auth="public")
    with pytest.raises(ValidationError) as refused:
        gg.services.create_token(public.id, "ci")
    assert "public" in str(refused.value)


def test_wait_returns_once_the_service_settles(gg):
    service = create(gg)
    ServiceRow.objects.filter(pk=service.id).update(status="ready")
    assert gg.services.wait(service.id, timeout=5, poll=0.1).status == "ready"
    ServiceRow.objects.filter(pk=service.id).update(status="deploying")
    with pytest.raises(Exception, match="still deploying"):
        Services(gg.http).wait(service.id, timeout=0.3, poll=0.1)


def test_the_cli_creates_lists_scales_and_deletes_with_confirmation(cli):  # noqa: F811
    code, out, err = cli("--json", "services", "create", "echo", "--image", "python:3.11-slim",
                         "--port", "8080", "--region", "local", "--env", "MODEL=small",
                         "--min-replicas", "1", "--", *ECHO)  # fmt: skip
    assert code == 0, err
    created = json.loads(out)
    assert (created["auth"], created["env"], created["command"]) == (
        "token",
        {"MODEL": "small"},
        ECHO,
    )
    code, out, _ = cli("services", "list")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "NAME", "STATUS"]
    assert "echo" in out
    code, out, _ = cli(
        "--json", "services", "scale", str(created["id"]), "--min", "0", "--max", "4"
    )
    assert code == 0 and (json.loads(out)["min_replicas"], json.loads(out)["max_replicas"]) == (
        0,
        4,
    )
    code, out, _ = cli("services", "token", str(created["id"]), "ci")
    assert code == 0 and "shown only now" in out
    code, out, _ = cli("--json", "services", "get", str(created["id"]))
    assert code == 0 and json.loads(out)["name"] == "echo" and "replica_list" in json.loads(out)
    # Bad input: usage errors exit 2, the server's refusals with their own codes.
    assert cli("services", "create", "x", "--image", "i", "--port", "1", "--region", "local",
               "--env", "NOEQUALS", "--", "run")[0] == 2  # fmt: skip
    code, _, err = cli("services", "create", "echo", "--image", "python:3.11-slim", "--port",
                       "8080", "--region", "local", "--", *ECHO)  # fmt: skip
    assert code == 6 and err  # the name is taken: a conflict
    # Deleting asks first; without a terminal it wants --yes.
    code, _, err = cli("services", "delete", str(created["id"]))
    assert code == 2 and "--yes" in err
    assert ServiceRow.objects.filter(pk=created["id"]).exists()
    code, out, _ = cli("services", "delete", str(created["id"]), "--yes")
    assert code == 0 and f"Deleted service {created['id']}" in out
    assert cli("services", "get", str(created["id"]))[0] == 4  # not found


def test_autoscaling_is_chosen_at_create_and_changed_later(gg, cli):  # noqa: F811
    service = create(gg, autoscale={"metric": "rps", "target": 5})
    assert service.autoscale == {"metric": "rps", "target": 5.0, "scale_down_delay": 300}
    assert create(gg, "default").autoscale == {
        "metric": "concurrency", "target": 10.0, "scale_down_delay": 300,
    }  # fmt: skip
    changed = gg.services.autoscale(service.id, metric="concurrency", target=4, scale_down_delay=60)
    assert changed.autoscale == {"metric": "concurrency", "target": 4.0, "scale_down_delay": 60}
    with pytest.raises(ValidationError) as refused:  # a CPU service has no GPU to measure
        gg.services.autoscale(service.id, metric="gpu", target=70)
    assert "GPU utilisation needs GPU replicas" in str(refused.value)

    code, out, err = cli("--json", "services", "autoscale", str(service.id), "rps=2.5",
                         "--scale-down-delay", "60")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["autoscale"] == {"metric": "rps", "target": 2.5, "scale_down_delay": 60}
    code, _, err = cli("services", "autoscale", str(service.id), "gpu=0")
    assert code == 2 and "METRIC=TARGET" in err  # refused before asking the server
    code, _, err = cli("services", "autoscale", str(service.id), "gpu=70")
    assert code == 1 and "needs GPU replicas" in err  # (the server's word)
    code, _, err = cli("services", "autoscale", str(service.id), "cpu=70")
    assert code == 1 and "runs on the console's host" in err  # (the server's word)
    code, out, err = cli("--json", "services", "create", "cli", "--image", "python:3.11-slim",
                         "--port", "8080", "--region", "local", "--autoscale", "rps=7",
                         "--", *ECHO)  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["autoscale"] == {"metric": "rps", "target": 7.0, "scale_down_delay": 300}


def test_scaling_decisions_are_read_in_the_sdk_and_cli(gg, cli):  # noqa: F811
    service = create(gg, min_replicas=1, max_replicas=4)
    row = ServiceRow.objects.get(pk=service.id)
    # What the reconcile pass records (tests/services/test_autoscaling.py makes real ones).
    now = timezone.now()
    for seconds, (before, after, window) in enumerate([(1, 3, "panic"), (3, 2, "stable")]):
        ServiceScaleEvent.objects.create(
            service=row, at=now + timedelta(seconds=seconds), from_replicas=before,
            to_replicas=after, window=window, metric="concurrency", target=10,
            stable_value=12.5, panic_value=31.0, held_requests=0,
        )  # fmt: skip
    events = gg.services.scale_events(service.id)
    assert [(e.from_replicas, e.to_replicas, e.window) for e in events] == [
        (3, 2, "stable"), (1, 3, "panic"),
    ]  # fmt: skip
    assert events[0].stable_value == 12.5 and events[0].cold_start_seconds is None
    code, out, err = cli("services", "events", str(service.id))
    assert code == 0, err
    assert out.splitlines()[0].split()[:4] == ["AT", "FROM_REPLICAS", "TO_REPLICAS", "WINDOW"]
    assert "panic" in out and "stable" in out


def test_secrets_are_named_through_the_sdk_and_the_cli(gg, cli, world):  # noqa: F811
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="HF_TOKEN", value="hf_x")
    service = create(gg, secrets=["HF_TOKEN"], min_replicas=0)
    assert service.secrets == ["HF_TOKEN"] and "hf_x" not in json.dumps(service.to_dict())
    with pytest.raises(ValidationError, match="No secret named NOPE"):
        create(gg, "other", secrets=["NOPE"])
    code, out, err = cli("--json", "services", "create", "cli", "--image", "python:3.11-slim",
                         "--port", "8080", "--region", "local", "--secret", "HF_TOKEN",
                         "--min-replicas", "0", "--", *ECHO)  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["secrets"] == ["HF_TOKEN"]


def test_volumes_are_named_through_the_sdk_and_the_cli(gg, cli, world):  # noqa: F811
    VolumeFactory(tenant=world.tenant, name="weights")
    service = create(gg, volumes=[{"name": "weights", "path": "/models"}], min_replicas=0)
    assert service.volumes == [{"name": "weights", "path": "/models"}]
    with pytest.raises(ValidationError, match="No volume named nope"):
        create(gg, "other", volumes=[{"name": "nope", "path": "/models"}])
    code, out, err = cli("--json", "services", "create", "cli", "--image", "python:3.11-slim",
                         "--port", "8080", "--region", "local", "--volume", "weights:/w",
                         "--min-replicas", "0", "--", *ECHO)  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["volumes"] == [{"name": "weights", "path": "/w"}]
    code, out, err = cli("services", "create", "rw", "--image", "python:3.11-slim",
                         "--port", "8080", "--region", "local", "--volume", "weights:/w:rw",
                         "--", *ECHO)  # fmt: skip
    assert code != 0 and "read-only" in err


def test_gpu_replicas_through_the_sdk_and_the_cli(gg, cli):  # noqa: F811
    gpu = {"image": "pytorch-2-5-cuda12-4", "region": "us-west", "gpu_type": "h100-80gb"}
    service = create(gg, "llm", **gpu, gpus_per_replica=2, min_replicas=0)
    assert (service.gpu_type, service.gpus_per_replica) == ("h100-80gb", 2)
    service = gg.services.update(service.id, gpus_per_replica=1)
    assert service.gpus_per_replica == 1 and service.revision == 2
    with pytest.raises(ValidationError, match="1 to 8 GPUs per replica"):
        create(gg, "big", **gpu, gpus_per_replica=9)
    code, out, err = cli("--json", "services", "create", "cli", "--image", "pytorch-2-5-cuda12-4",
                         "--port", "8080", "--region", "us-west", "--gpu-type", "h100-80gb",
                         "--autoscale", "gpu=70", "--min-replicas", "1", "--", *ECHO)  # fmt: skip
    assert code == 0, err
    created = json.loads(out)
    assert (created["gpus_per_replica"], created["autoscale"]["metric"]) == (1, "gpu")


def test_replica_logs_are_read_in_the_sdk_and_followed_in_the_cli(gg, cli, monkeypatch):  # noqa: F811
    service = create(gg, min_replicas=1)
    row = ServiceRow.objects.get(pk=service.id)
    # A replica as the reconcile pass records it, with what its process printed so far.
    replica = ServiceReplica.objects.create(
        service=row, revision=row.current_revision, state="ready", host_port=40001
    )
    replica.handle = f"service-{row.pk}-replica-{replica.pk}"
    replica.save(update_fields=["handle"])
    output = host_processes.run_dir(replica.handle) / "output.log"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text("loading weights\nready on :8080\n")
    try:
        assert gg.services.replica_logs(service.id, replica.pk) == [
            "loading weights",
            "ready on :8080",
        ]
        assert gg.services.replica_logs(service.id, replica.pk, tail=1) == ["ready on :8080"]
        with pytest.raises(ValidationError, match="tail"):
            gg.services.replica_logs(service.id, replica.pk, tail=0)
        with pytest.raises(NotFound):
            gg.services.replica_logs(service.id, replica.pk + 999)
        code, out, err = cli("services", "logs", str(service.id))
        assert code == 0, err
        assert out.splitlines() == ["loading weights", "ready on :8080"]

        # --follow prints only what is new on each poll, until Ctrl-C.
        polls = iter([lambda: output.write_text("loading weights\nready on :8080\nGET /\n")])

        def sleep(_seconds):
            step = next(polls, None)
            if step is None:
                raise KeyboardInterrupt
            step()

        monkeypatch.setattr(cli_services, "_pause", sleep)
        code, out, err = cli("services", "logs", str(service.id), "-f")
        assert code == 0, err
        assert out.splitlines() == ["loading weights", "ready on :8080", "GET /"]
    finally:
        shutil.rmtree(output.parent, ignore_errors=True)


def test_new_lines_are_what_follows_the_overlap():
    assert new_lines([], ["a", "b"]) == ["a", "b"]
    assert new_lines(["a", "b"], ["a", "b"]) == []
    assert new_lines(["a", "b", "c"], ["b", "c", "d"]) == ["d"]  # the tail moved on
    assert new_lines(["a"], ["x", "y"]) == ["x", "y"]  # no overlap: all of it
