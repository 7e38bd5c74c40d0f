"""SSH from a laptop, for real: Debian's OpenSSH client, through the console's SSH
gateway (served on a free port), to Debian's sshd running unprivileged as an
environment's job in the host sandbox (bubblewrap + slirp4netns) on the local backend.

The client uses the `~/.ssh/config` snippet the environment page shows (ProxyJump
through the gateway) and checks both host keys strictly: the environment's host key
stays the same across stop and start.

Where the host sandbox can't run these skip, saying so, except in CI (which installs it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from console.models import Membership
from console.services.memberships import membership_remove
from console.services.ssh_keys import ssh_key_add
from console.services.tokens import api_token_create
from environments import gateway, selectors, services, sshd
from environments.idle_rule import IdleStep
from environments.models import Environment, EnvironmentStatus
from jobs.backends import get_backend, local_volumes
from jobs.backends.local_sandbox import INNER_USER, sandbox_support
from jobs.services.secrets import tenant_secret_set
from tests.environments.conftest import SSH, wait_for_environment
from tests.servers import asgi_server  # noqa: F401  (fixture, for console_server)

if not sandbox_support().network and not os.environ.get("CI"):
    pytest.skip(
        f"no host sandbox with network here: {sandbox_support().summary}", allow_module_level=True
    )

pytestmark = pytest.mark.django_db(transaction=True)
SDK_SOURCE = Path(__file__).resolve().parents[2] / "clients" / "python" / "src"


def ssh(config, login, *command, extra=(), timeout=30):
    return subprocess.run(
        [SSH, "-F", str(config), *extra, login, *command],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def client_config(tmp_path, gateway, environment, key, name="config"):
    """The page's snippet, plus what a test needs: this key only, strict host keys from
    a known_hosts file holding the gateway's and the environment's keys."""
    known = tmp_path / f"{name}_known_hosts"
    known.write_text(f"{gateway.host_key_line}\n{selectors.known_hosts_line(environment)}\n")
    common = (
        f"    IdentityFile {key.private}\n    IdentitiesOnly yes\n    BatchMode yes\n"
        f"    StrictHostKeyChecking yes\n    UserKnownHostsFile {known}\n"
        "    ConnectTimeout 10\n"
    )
    config = tmp_path / f"{name}.ssh_config"
    config.write_text(
        selectors.ssh_config_snippet(environment) + common + "Host 127.0.0.1\n" + common
    )
    return config


def ssh_until_it_answers(config, login, *command, timeout=20):
    """sshd starts a moment after its job runs: retry until it answers."""
    deadline = time.monotonic() + timeout
    while True:
        result = ssh(config, login, *command)
        if result.returncode == 0 or time.monotonic() > deadline:
            return result


@pytest.fixture
def running(world, catalog, key_pair, ssh_gateway, tasks_in_process):
    member_key, admin_key = key_pair("member"), key_pair("admin")
    ssh_key_add(user=world.member, public_key=member_key.public)
    ssh_key_add(user=world.admin, public_key=admin_key.public)
    tenant_secret_set(tenant=world.tenant, user=world.owner, name="HF_TOKEN",
                      value="hf_s3cret 'quoted'", members_may_use=True)  # fmt: skip
    environment = services.environment_create(
        tenant=world.tenant, user=world.member, name="box", region="local",
        image="python-3.11", cpus=1, env={"GREETING": "hello world"}, secrets=["HF_TOKEN"],
    )  # fmt: skip
    services.environment_start(environment=environment, user=world.member)
    environment = wait_for_environment(environment, {EnvironmentStatus.RUNNING})
    return environment, member_key, admin_key


def test_the_right_key_gets_a_shell_that_writes_the_home_volume_and_files_survive_a_restart(
    running, ssh_gateway, tmp_path, world
):
    environment, member_key, _ = running
    assert selectors.ssh_command(environment) == (
        f"ssh -J box.acme@127.0.0.1:{ssh_gateway.port} {INNER_USER}@box.acme"
    )
    config = client_config(tmp_path, ssh_gateway, environment, member_key)
    result = ssh_until_it_answers(
        config, "box.acme", "echo hi > /workspace/f && cat /workspace/f && id -un"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["hi", INNER_USER]
    environment.refresh_from_db()
    assert environment.last_activity_at is not None

    services.environment_stop(environment=environment, user=world.member)
    environment = wait_for_environment(environment, {EnvironmentStatus.STOPPED})
    # Stopped: the gateway can't reach it, and says so.
    refused = ssh(config, "box.acme", "true")
    assert refused.returncode != 0
    first_job = environment.current_job_id

    services.environment_start(environment=environment, user=world.member)
    environment = wait_for_environment(environment, {EnvironmentStatus.RUNNING})
    assert environment.current_job_id != first_job  # each start is a new job
    # The same known_hosts (strict): the host key stayed; the file is still there.
    again = ssh_until_it_answers(config, "box.acme", "cat /workspace/f")
    assert again.returncode == 0, again.stderr
    assert again.stdout == "hi\n"


def test_a_wrong_key_and_a_password_are_refused(running, ssh_gateway, tmp_path, key_pair):
    environment, member_key, _ = running
    stranger = key_pair("stranger")  # never registered
    config = client_config(tmp_path, ssh_gateway, environment, stranger)
    result = ssh(config, "box.acme", "true")
    assert result.returncode == 255
    assert "Permission denied (publickey)" in result.stderr

    # Password: neither the gateway nor the environment's sshd offers it.
    config = client_config(tmp_path, ssh_gateway, environment, member_key, name="pw")
    password = ("-o", "PreferredAuthentications=password", "-o", "PubkeyAuthentication=no")
    result = ssh(config, "box.acme", "true", extra=password)
    assert result.returncode == 255
    assert "Permission denied (publickey)" in result.stderr
    host, port = selectors.environment_port_address(environment=environment)
    direct = subprocess.run(
        [SSH, "-F", "/dev/null", "-v", "-p", str(port), *password, "-o", "BatchMode=yes",
         "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         f"{INNER_USER}@{host}", "true"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert direct.returncode == 255
    assert "Authentications that can continue: publickey\n" in direct.stderr


def test_another_tenant_cant_reach_it_and_a_removed_member_is_refused(
    running, ssh_gateway, tmp_path, world, other_world, key_pair
):
    environment, member_key, admin_key = running
    outsider = key_pair("outsider")
    ssh_key_add(user=other_world.owner, public_key=outsider.public)
    config = client_config(tmp_path, ssh_gateway, environment, outsider)
    result = ssh(config, "box.acme", "true")
    assert result.returncode == 255 and "Permission denied" in result.stderr

    # The admin may use any environment of the organisation…
    admin_config = client_config(tmp_path, ssh_gateway, environment, admin_key, name="admin")
    admin_in = ssh_until_it_answers(admin_config, "box.acme", "true")
    assert admin_in.returncode == 0, admin_in.stderr
    # …until removed: refused at the next connection, though the key is still in the
    # running environment's authorized_keys.
    membership_remove(
        membership=world.membership(world.admin), by_membership=world.membership(world.owner)
    )
    assert not Membership.objects.filter(user=world.admin, tenant=world.tenant).exists()
    result = ssh(admin_config, "box.acme", "true")
    assert result.returncode == 255 and "Permission denied" in result.stderr
    # The creator still gets in.
    member_config = client_config(tmp_path, ssh_gateway, environment, member_key, name="m")
    assert ssh(member_config, "box.acme", "true").returncode == 0


def test_a_key_added_while_it_runs_gets_in_without_a_restart(
    running, ssh_gateway, tmp_path, world, key_pair
):
    environment, member_key, admin_key = running
    member_config = client_config(tmp_path, ssh_gateway, environment, member_key, name="m")
    assert ssh_until_it_answers(member_config, "box.acme", "true").returncode == 0
    laptop = key_pair("new-laptop")
    ssh_key_add(user=world.member, public_key=laptop.public)  # publishes it on commit
    config = client_config(tmp_path, ssh_gateway, environment, laptop, name="laptop")
    result = ssh(config, "box.acme", "echo from the new laptop")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "from the new laptop\n"
    job = environment.current_job
    assert job.pk == Environment.objects.get(pk=environment.pk).current_job_id  # no restart
    # A member removed: the running sshd no longer holds their key either.
    published = get_backend(job.backend).published_dir(job) / sshd.PUBLISHED_KEYS
    assert admin_key.public.split()[1] in published.read_text()
    membership_remove(
        membership=world.membership(world.admin), by_membership=world.membership(world.owner)
    )
    assert admin_key.public.split()[1] not in published.read_text()
    assert laptop.public.split()[1] in published.read_text()


def test_a_session_on_the_gateway_itself_says_how_to_connect(running, ssh_gateway, tmp_path):
    _, member_key, _ = running
    known = tmp_path / "gateway_known_hosts"
    known.write_text(ssh_gateway.host_key_line + "\n")
    result = subprocess.run(
        [SSH, "-F", "/dev/null", "-i", str(member_key.private), "-o", "IdentitiesOnly=yes",
         "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={known}",
         "-p", str(ssh_gateway.port), "box.acme@127.0.0.1", "ls"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 1
    assert "ssh -J box.acme@127.0.0.1:" in result.stderr


def test_an_open_session_is_activity_and_an_idle_environment_is_stopped_keeping_its_files(
    running, ssh_gateway, tmp_path, monkeypatch
):
    environment, member_key, _ = running
    monkeypatch.setattr(gateway, "ACTIVITY_SECONDS", 0.5)
    config = client_config(tmp_path, ssh_gateway, environment, member_key)
    assert ssh_until_it_answers(config, "box.acme", "true").returncode == 0
    environment.refresh_from_db()
    opened = environment.last_activity_at
    # A session that stays open keeps recording activity while it lasts.
    session = ssh(config, "box.acme", "echo kept > /workspace/notes; sleep 3")
    assert session.returncode == 0, session.stderr
    environment.refresh_from_db()
    assert environment.last_activity_at > opened + timedelta(seconds=2)

    # Nobody for an hour: the idle rule stops the real job; the home volume stays.
    later = environment.last_activity_at + timedelta(minutes=61)
    decision = services.environment_idle_check(environment=environment, now=later)
    assert decision.step is IdleStep.STOP, decision.readings
    environment = wait_for_environment(environment, {EnvironmentStatus.STOPPED})
    assert "stopped by its idle policy" in environment.current_job.status_reason
    home = local_volumes.volume_folder(
        tenant_id=environment.tenant_id, volume_id=environment.home_volume_id
    )
    assert (home / "notes").read_text() == "kept\n"


@pytest.fixture
def console_server(ssh_gateway, monkeypatch, request):
    """The console's web server (its own process), told where the test's gateway is."""
    monkeypatch.setenv("SSH_GATEWAY_HOST", ssh_gateway.host)
    monkeypatch.setenv("SSH_GATEWAY_PORT", str(ssh_gateway.port))
    return request.getfixturevalue("asgi_server")


def test_gpugeek_ssh_runs_openssh_through_the_gateway(
    running, ssh_gateway, tmp_path, world, console_server
):
    """The CLI asks the console for the environment's command and becomes that ssh."""
    environment, member_key, _ = running
    config = client_config(tmp_path, ssh_gateway, environment, member_key)
    assert ssh_until_it_answers(config, "box.acme", "echo from-cli > /workspace/g").returncode == 0
    _, token = api_token_create(user=world.member, tenant=world.tenant, name="cli")
    cli_env = {**os.environ, "GPUGEEK_URL": console_server.url, "GPUGEEK_TOKEN": token,
               "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHONPATH": str(SDK_SOURCE)}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "gpugeek", "ssh", "-F", str(config), "box", "--", "cat",
         "/workspace/g"],
        capture_output=True, text=True, timeout=60, env=cli_env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "from-cli\n"


def test_sessions_see_the_environment_s_env_and_secrets_but_not_its_host_key(
    running, ssh_gateway, tmp_path
):
    environment, member_key, _ = running
    config = client_config(tmp_path, ssh_gateway, environment, member_key)
    result = ssh_until_it_answers(
        config, "box.acme", 'echo "$GREETING|$HF_TOKEN|${SSHD_HOST_KEY:-none}|$PWD"'
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello world|hf_s3cret 'quoted'|none|/workspace\n"
    # sftp (scp, IDEs) goes through the same session script.
    batch = tmp_path / "sftp-batch"
    batch.write_text("put /etc/hostname uploaded\nls\n")
    sftp = subprocess.run(
        ["sftp", "-F", str(config), "-b", str(batch), "box.acme"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert sftp.returncode == 0, sftp.stderr
    assert "uploaded" in sftp.stdout
