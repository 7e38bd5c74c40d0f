"""Issue 26: a host job is untrusted code on the console's machine. Each test here is a
hostile job, run for real through the local backend (its supervisor, bubblewrap and
slirp4netns): it tries to read the console's secrets, another tenant's job, the console's
services, its own bookkeeping, to outlive its cancel or to exhaust the host. Every attempt
fails (the job stopped with the reason where it hit a limit), and an ordinary job still
works.

Where bubblewrap can't run these skip, saying so, except in CI (which installs it)."""

from __future__ import annotations

import json
import os
import socket
import time
from io import StringIO
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
from django.conf import settings
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from console import host_access
from console.env import embedded_redis_url_file, stored_redis_password, write_private
from console.models import Tenant
from console.service_errors import ServiceError
from jobs import services
from jobs.actors import SYSTEM
from jobs.backends.local import LocalBackend
from jobs.backends.local_sandbox import job_uid, sandbox_support, work_root
from jobs.models import JobStatus
from jobs.services.files import jobs_files_prune
from jobs.tasks import job_files_discard_task
from tests.conftest import signed_in_client
from tests.factories import UserFactory
from tests.jobs.test_local_lifecycle import spec, wait_for_status
from tests.jobs_helpers import launch

ENDED = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}

if not sandbox_support().available and not os.environ.get("CI"):
    pytest.skip(f"no host sandbox here: {sandbox_support().reason}", allow_module_level=True)

pytestmark = pytest.mark.django_db(transaction=True)


def output(job) -> list[str]:
    return [line.text for line in LocalBackend().logs(job)]


def run(world, program: str, *, env=None, timeout=30, **overrides):
    """Launch a Python program as a host job of `world` and wait for it to end."""
    job = launch(world, spec(["python", "-c", program], env=env or {}, **overrides))
    job = wait_for_status(job, ENDED, timeout=timeout)
    assert job.exit_code != 127, output(job)  # the sandbox itself always starts
    return job


def wait_until(predicate, timeout=20, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def processes_of(uid: int) -> list[psutil.Process]:
    return [
        p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid
    ]


def console_secret_paths() -> list[Path]:
    """The files a host job must never read: the secret key, the database, the embedded
    Redis's URL and password (made here where this session's topology has none)."""
    data_dir = Path(settings.DATA_DIR)
    stored_redis_password(data_dir)
    url_file = embedded_redis_url_file(data_dir)
    if not url_file.exists():
        write_private(url_file, os.environ.get("REDIS_URL", "redis://:x@127.0.0.1:1/0"))
    database = Path(str(settings.DATABASES["default"]["NAME"]))
    if not database.is_absolute() or not database.exists():
        database = data_dir / "test-gpugeek.sqlite3"  # PostgreSQL: SQLite's place stands in
        database.touch(mode=0o600)
    paths = [data_dir / "secret_key", database, url_file, data_dir / "redis" / "redis-password"]
    assert all(path.exists() for path in paths)
    return paths


PROBE_PATHS = (
    "import json, os, sys\n"
    "seen = {}\n"
    "for path in sys.argv[1:]:\n"
    "    try:\n"
    "        with open(path, 'rb') as f: f.read(1); seen[path] = 'READ'\n"
    "    except OSError as e: seen[path] = type(e).__name__\n"
    "print(json.dumps(seen))\n"
)


def test_an_ordinary_job_works_in_its_sandbox(world, catalog):
    program = (
        "import os, pathlib\n"
        "pathlib.Path('result.txt').write_text('42')\n"
        "print(open('result.txt').read(), os.getcwd(), os.environ['HOME'], flush=True)\n"
        "import tempfile; tempfile.TemporaryFile().write(b'x')\n"
    )
    job = run(world, program)
    assert job.status == JobStatus.SUCCEEDED, (job.status_reason, output(job))
    assert output(job) == ["42 /workspace /workspace"]
    # Its file is in its work dir on the host, owned by the job's own uid.
    written = LocalBackend().workdir(job) / "result.txt"
    assert written.read_text() == "42"
    if sandbox_support().own_uid:
        assert written.stat().st_uid == job_uid(job) != os.geteuid()


def test_a_job_reads_nothing_of_the_console_by_path(world, catalog):
    targets = [
        *console_secret_paths(),
        Path(settings.DATA_DIR),
        Path(settings.BASE_DIR) / "console" / "settings.py",
        Path("/etc/shadow"),
    ]
    job = run(world, PROBE_PATHS.replace("sys.argv[1:]", repr([str(t) for t in targets])))
    assert job.status == JobStatus.SUCCEEDED, output(job)
    seen = json.loads(output(job)[0])
    assert "READ" not in seen.values(), seen
    # The console's files don't even exist in its view.
    assert all(seen[str(t)] == "FileNotFoundError" for t in targets[:-1]), seen
    assert seen["/etc/shadow"] in ("PermissionError", "FileNotFoundError")


def test_a_job_runs_as_an_unprivileged_uid_outside_the_sandbox_too(world, catalog):
    if not sandbox_support().own_uid:
        pytest.skip("the console does not run as root: jobs run as its user")
    job = launch(
        world, spec(["python", "-c", "import time; print('up', flush=True); time.sleep(30)"])
    )
    job = wait_for_status(job, {JobStatus.RUNNING})
    wait_until(lambda: output(job) == ["up"], what="the job to start")
    uid = job_uid(job)
    assert uid not in (0, os.geteuid())
    holders = processes_of(uid)
    assert holders, "the job's processes run as its own uid"
    assert all(p.uids().real == p.uids().effective == uid for p in holders)
    services.job_cancel(job=job, actor=SYSTEM)
    LocalBackend().cancel(job)
    wait_for_status(job, {JobStatus.CANCELLED})


def test_a_job_sees_only_its_own_processes_and_not_another_tenants_environment(
    world, other_world, catalog
):
    secret = "acme-owner-only-secret-7f3a"
    victim = launch(
        world,
        spec(
            ["python", "-c", "import time; print('up', flush=True); time.sleep(60)"],
            env={"ACME_TOKEN": secret},
        ),
    )
    victim = wait_for_status(victim, {JobStatus.RUNNING})
    wait_until(lambda: output(victim) == ["up"], what="the victim to start")
    try:
        program = (
            "import os, json\n"
            "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "found = []\n"
            "for pid in pids:\n"
            "    try: found.append(open(f'/proc/{pid}/environ', 'rb').read())\n"
            "    except OSError: pass\n"
            f"print(json.dumps({{'pids': pids, 'leak': any(b'{secret}' in e for e in found)}}))\n"
        )
        attacker = run(other_world, program)
        assert attacker.status == JobStatus.SUCCEEDED, output(attacker)
        seen = json.loads(output(attacker)[0])
        assert not seen["leak"]
        # Its own python and the sandbox's init only: no host or victim process.
        assert len(seen["pids"]) <= 3, seen["pids"]
    finally:
        services.job_cancel(job=victim, actor=SYSTEM)
        LocalBackend().cancel(victim)
        wait_for_status(victim, {JobStatus.CANCELLED})


@pytest.fixture
def listeners():
    """Servers of 'the console' on this host: the loopback in both families and every
    address of the host (as a PostgreSQL on 0.0.0.0 would be)."""
    sockets = []
    for family, host in (
        (socket.AF_INET, "127.0.0.1"),
        (socket.AF_INET6, "::1"),
        (socket.AF_INET, "0.0.0.0"),
    ):
        server = socket.socket(family, socket.SOCK_STREAM)
        server.bind((host, 0))
        server.listen(16)
        sockets.append(server)
    yield sockets
    for server in sockets:
        server.close()


def test_a_job_cannot_reach_the_consoles_services(world, catalog, listeners):
    host_addresses = sorted(
        {
            entry.address
            for entries in psutil.net_if_addrs().values()
            for entry in entries
            if entry.family == socket.AF_INET
        }
    )
    targets = [("127.0.0.1", listeners[0].getsockname()[1]), ("::1", listeners[1].getsockname()[1])]
    targets += [(address, listeners[2].getsockname()[1]) for address in host_addresses]
    targets += [("10.0.2.2", listeners[0].getsockname()[1])]  # slirp's gateway to the host
    redis = os.environ.get("REDIS_URL", "")
    if redis:
        parts = urlsplit(redis)
        targets.append((parts.hostname, parts.port or 6379))
    targets.append(("127.0.0.1", 5432))  # PostgreSQL, where it runs
    program = (
        "import json, socket\n"
        f"targets = {targets!r}\n"
        "reached = []\n"
        "for host, port in targets:\n"
        "    family = socket.AF_INET6 if ':' in host else socket.AF_INET\n"
        "    s = socket.socket(family, socket.SOCK_STREAM); s.settimeout(3)\n"
        "    try: s.connect((host, port)); reached.append([host, port])\n"
        "    except OSError: pass\n"
        "    finally: s.close()\n"
        "print(json.dumps(reached))\n"
    )
    job = run(world, program, timeout=60)
    assert job.status == JobStatus.SUCCEEDED, output(job)
    assert json.loads(output(job)[0]) == []


def test_a_job_cannot_forge_its_outcome_or_another_jobs_log(world, other_world, catalog):
    backend = LocalBackend()
    victim = run(other_world, "print('the real line', flush=True)")
    assert victim.status == JobStatus.SUCCEEDED
    victim_log = backend.log_path(victim)
    # The attacker knows where the console keeps control files and logs on the host.
    job = launch(world, spec(["python", "-c", "pass"]))
    run_dir = backend.run_dir(job)
    program = (
        "import time\n"
        "for path, text in (\n"
        f"    ({str(run_dir / 'exit_code')!r}, '0'),\n"
        f"    ({str(run_dir / 'intent')!r}, ''),\n"
        f"    ({str(victim_log)!r}, 'forged line\\n'),\n"
        "):\n"
        "    try:\n"
        "        with open(path, 'a') as f: f.write(text)\n"
        "        print('WROTE', path, flush=True)\n"
        "    except OSError as e: print('DENIED', type(e).__name__, flush=True)\n"
        "time.sleep(1)\n"
        "raise SystemExit(3)\n"
    )
    job = run(world, program)
    assert not any(line.startswith("WROTE") for line in output(job)), output(job)
    assert job.status == JobStatus.FAILED and job.exit_code == 3  # what waitpid said, not '0'
    assert output(victim) == ["the real line"]


def test_processes_a_job_leaves_behind_die_with_it_whatever_they_did(world, catalog, settings):
    settings.JOB_TERMINATION_GRACE_SECONDS = 1
    program = (
        "import os, subprocess, time\n"
        # setsid + double fork: a daemon out of the job's session and process group,
        # ignoring SIGTERM.
        "subprocess.Popen(['setsid', 'sh', '-c', "
        '\'trap "" TERM; (trap "" TERM; while true; do sleep 1; done) & exit 0\'])\n'
        "print('escaped', flush=True)\n"
        "time.sleep(60)\n"
    )
    job = launch(world, spec(["python", "-c", program]))
    job = wait_for_status(job, {JobStatus.RUNNING})
    wait_until(lambda: "escaped" in output(job), what="the escape")
    backend = LocalBackend()
    sandbox_init = int((backend.run_dir(job) / "sandbox.pid").read_text())
    namespace = os.readlink(f"/proc/{sandbox_init}/ns/pid")

    def members() -> list[int]:
        found = []
        for process in psutil.process_iter():
            try:
                if os.readlink(f"/proc/{process.pid}/ns/pid") == namespace:
                    found.append(process.pid)
            except OSError:
                pass
        return found

    wait_until(lambda: len(members()) >= 3, what="the daemon to run")
    services.job_cancel(job=job, actor=SYSTEM)
    backend.cancel(job)

    def gone() -> bool:
        services.jobs_observe(backend_name="local")  # enforces the grace as the watcher does
        return not members()

    wait_until(gone, timeout=30, what="every process of the job to end")
    assert wait_for_status(job, {JobStatus.CANCELLED}).status == JobStatus.CANCELLED
    if sandbox_support().own_uid:
        assert processes_of(job_uid(job)) == []


def test_a_job_filling_its_work_dir_is_stopped_with_the_reason(world, catalog, settings):
    settings.LOCAL_JOB_DISK_GIB = 16 / 1024  # 16 MiB
    program = (
        "import time\n"
        "for i in range(200):\n"
        "    open(f'fill-{i}', 'wb').write(b'x' * (1 << 20)); time.sleep(0.02)\n"
        "print('filled 200 MiB unchecked', flush=True)\n"
    )
    job = run(world, program)
    assert job.status == JobStatus.FAILED, (job.status_reason, output(job))
    assert "disk limit of 0.02 GiB" in job.status_reason, output(job)
    assert "filled 200 MiB unchecked" not in output(job)


def test_one_file_past_the_disk_cap_stops_the_job(world, catalog, settings):
    settings.LOCAL_JOB_DISK_GIB = 8 / 1024  # 8 MiB
    job = run(world, "open('big', 'wb').write(b'x' * (64 << 20))")
    assert job.status == JobStatus.FAILED
    assert "disk limit" in job.status_reason


def test_a_fork_bomb_is_contained_and_stopped(world, catalog, settings):
    settings.LOCAL_JOB_MAX_PROCESSES = 48
    program = (
        "import os, time\n"
        "children = 0\n"
        "while True:\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(120); os._exit(0)\n"
        "        children += 1\n"
        "    except OSError:\n"
        "        time.sleep(0.01)\n"
    )
    job = run(world, program, timeout=60)
    assert job.status == JobStatus.FAILED, (job.status_reason, output(job))
    assert "limit of 48 processes" in job.status_reason
    if sandbox_support().own_uid:
        wait_until(lambda: processes_of(job_uid(job)) == [], what="the bomb to be gone")


def test_a_job_passing_its_memory_limit_is_stopped_with_the_reason(world, catalog):
    limit = LocalBackend().limits(launch(world, spec(["true"]))).memory_bytes
    program = (
        "import time\n"
        "held = []\n"
        f"for _ in range({(limit * 3) >> 24}):\n"
        "    held.append(b'x' * (16 << 20)); time.sleep(0.02)\n"
        "print('allocated past the limit', flush=True)\n"
    )
    job = run(world, program, timeout=120)
    assert job.status == JobStatus.FAILED, (job.status_reason, output(job))
    assert "allocated past the limit" not in output(job)
    assert "memory passed its limit" in job.status_reason or "MemoryError" in "\n".join(output(job))


def test_the_job_page_states_its_limits(world, catalog):
    job = launch(world, spec(["true"]))
    page = signed_in_client(world.owner, world.tenant).get(reverse("jobs:detail", args=[job.pk]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "Runs in a sandbox on the console" in text
    assert "processes" in text and "GiB disk" in text


def test_deleting_a_job_removes_its_work_and_run_dirs(
    world, catalog, django_capture_on_commit_callbacks, monkeypatch
):
    # The task runs here, as the worker would run it.
    monkeypatch.setattr(
        job_files_discard_task, "delay", lambda *args: job_files_discard_task.apply(args=args)
    )
    job = run(world, "open('keep', 'w').write('x')")
    backend = LocalBackend()
    workdir, run_dir = backend.workdir(job), backend.run_dir(job)
    assert workdir.exists() and run_dir.exists()
    with django_capture_on_commit_callbacks(execute=True):
        services.job_delete(job=job, user=world.owner)
    assert not workdir.exists() and not run_dir.exists()


def test_finished_jobs_work_dirs_are_pruned_after_the_retention(world, catalog, settings):
    job = run(world, "open('keep', 'w').write('x')")
    backend = LocalBackend()
    workdir = backend.workdir(job)
    jobs_files_prune(now=job.finished_at)
    assert workdir.exists()  # within the retention
    later = job.finished_at + __import__("datetime").timedelta(
        hours=settings.LOCAL_JOB_RETENTION_HOURS + 1
    )
    jobs_files_prune(now=later)
    assert not workdir.exists()
    assert backend.log_path(job).exists()  # its output stays until the log is archived


def test_work_dirs_are_outside_the_data_dir():
    assert not work_root().resolve().is_relative_to(Path(settings.DATA_DIR).resolve())


# --- without a sandbox: one organisation only ------------------------------------------


@pytest.fixture
def no_sandbox(settings):
    settings.LOCAL_JOB_SANDBOX = False
    assert not sandbox_support().available


@pytest.fixture
def staff(db):
    return UserFactory(email="staff@gpugeek.test", is_staff=True)


def test_without_a_sandbox_a_second_organisation_is_refused_host_access(
    no_sandbox, world, other_world, staff
):
    other_world.tenant.may_run_on_host = False
    other_world.tenant.save(update_fields=["may_run_on_host"])
    with pytest.raises(ServiceError, match="Only one organisation may run jobs on this host"):
        host_access.tenant_set_may_run_on_host(tenant=other_world.tenant, allowed=True, user=staff)
    other_world.tenant.refresh_from_db()
    assert not other_world.tenant.may_run_on_host
    # The API says so with 409; the staff page with a message and the reason.
    client = Client()
    client.force_login(staff)
    answer = client.patch(
        f"/api/v1/staff/tenants/{other_world.tenant.slug}",
        {"may_run_on_host": True},
        content_type="application/json",
    )
    assert answer.status_code == 409, answer.content
    assert "LOCAL_JOB_SANDBOX" in answer.json()["detail"]
    page = client.post(
        reverse("staff_tenant_detail", args=[other_world.tenant.slug]),
        {"may_run_on_host": "on"},
        follow=True,
    )
    assert "Only one organisation may run jobs on this host" in page.content.decode()
    assert "not sandboxed" in page.content.decode()


def test_with_a_sandbox_a_second_organisation_may_run_on_the_host(world, other_world, staff):
    other_world.tenant.may_run_on_host = False
    other_world.tenant.save(update_fields=["may_run_on_host"])
    host_access.tenant_set_may_run_on_host(tenant=other_world.tenant, allowed=True, user=staff)
    other_world.tenant.refresh_from_db()
    assert other_world.tenant.may_run_on_host


def test_healthz_tells_staff_whether_host_jobs_are_sandboxed(no_sandbox, staff):
    client = Client()
    client.force_login(staff)
    body = client.get("/healthz").json()
    assert body["components"]["host_sandbox"]["status"] == "degraded"
    assert "LOCAL_JOB_SANDBOX" in body["components"]["host_sandbox"]["note"]
    assert "components" not in Client().get("/healthz").json()  # anonymous: nothing


def test_the_demo_data_gives_host_access_to_acme_only(db):
    call_command("seed_demo", stdout=StringIO())
    assert set(Tenant.objects.filter(may_run_on_host=True).values_list("slug", flat=True)) == {
        "acme"
    }
