"""`client.environments`, `gpugeek env …` and `gpugeek ssh` against the real server
(uvicorn on the test database): create, get, change, start, keep running, stop, delete,
the refusals as the SDK raises them and the CLI exits, and the ssh command line. No
worker runs here, so the job's status is moved as the watcher would; the real ssh through
`gpugeek ssh` into a running sshd is in tests/environments/test_ssh.py."""

from __future__ import annotations

import json
import shlex

import pytest
from gpugeek import Environment
from gpugeek.errors import Conflict, GpuGeekError, NotFound, ValidationError

from console.services.ssh_keys import ssh_key_add
from environments.models import Environment as EnvironmentRow
from storage.models import Volume
from tests.factories import ed25519_public_key_line
from tests.jobs_helpers import advance_to
from tests.sdk.test_cli import cli  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


@pytest.fixture
def keyed(world):
    ssh_key_add(user=world.owner, public_key=ed25519_public_key_line())


def test_an_environment_is_created_started_kept_running_stopped_and_deleted(gg, keyed):
    created = gg.environments.create(
        "box", region="local", image="python-3.11", cpus=1, env={"A": "1"},
        idle_policy={"idle_minutes": 30, "warning_minutes": 5},
    )  # fmt: skip
    assert isinstance(created, Environment)
    assert (created.status, created.home_volume, created.env) == ("stopped", "box-home", {"A": "1"})
    assert created.idle_policy["idle_minutes"] == 30
    assert [e.name for e in gg.environments.list()] == ["box"]
    assert gg.environments.update("box", cpus=2).cpus == 2

    started = gg.environments.start("box")
    assert started.status == "starting" and started.current_job
    with pytest.raises(Conflict):
        gg.environments.start("box")
    with pytest.raises(Conflict):  # not running yet: nothing to keep running
        gg.environments.keep_alive("box")
    advance_to(EnvironmentRow.objects.get(name="box").current_job, "running")
    assert gg.environments.wait("box", timeout=5, poll=0.1).status == "running"
    kept = gg.environments.keep_alive("box", minutes=90)
    assert kept.keep_alive_until is not None and kept.idle_stop_at is None
    argv = gg.environments.ssh_argv("box", ["nvidia-smi"])
    assert argv == [*shlex.split(kept.ssh_command), "nvidia-smi"]
    assert argv[:2] == ["ssh", "-J"] and argv[-2] == "job@box.acme"

    assert gg.environments.stop("box").status == "stopping"
    advance_to(EnvironmentRow.objects.get(name="box").current_job, "cancelled")
    gg.environments.wait("box", statuses=("stopped",), timeout=5, poll=0.1)
    with pytest.raises(GpuGeekError, match="gpugeek env start box"):
        gg.environments.ssh_argv("box")
    gg.environments.delete("box", keep_volume=True)
    with pytest.raises(NotFound):
        gg.environments.get("box")
    assert Volume.objects.get(name="box-home").deleted_at is None


def test_bad_input_and_a_reused_name_are_clear_errors(gg, other_world):
    gg.environments.create("box", region="local", image="python-3.11", cpus=1)
    with pytest.raises(Conflict):
        gg.environments.create("box", region="local", image="python-3.11", cpus=1)
    with pytest.raises(ValidationError) as bad:
        gg.environments.create("Bad_Name", region="local", image="python-3.11", cpus=1)
    assert "name" in bad.value.errors
    with pytest.raises(ValidationError) as bad:
        gg.environments.create("other", region="local", image="python-3.11", cpus=1,
                               idle_policy={"idle_minutes": 1})  # fmt: skip
    assert "idle_policy" in bad.value.errors
    with pytest.raises(ValidationError):
        gg.environments.keep_alive("box", minutes=-1)
    assert [e.name for e in gg.environments.list()] == ["box"]  # nothing half-created
    with pytest.raises(NotFound):
        gg.environments.get("theirs")


def test_the_cli_creates_starts_prints_the_ssh_command_and_deletes(cli, world, keyed):  # noqa: F811
    code, out, err = cli("--json", "env", "create", "box", "--region", "local", "--image",
                         "python-3.11", "--cpus", "1", "--idle-minutes", "45",
                         "--secret", "HF_TOKEN")  # fmt: skip
    assert code == 1 and "HF_TOKEN" in err, (code, out, err)  # an unknown secret: a 400
    code, out, err = cli("--json", "env", "create", "box", "--region", "local", "--image",
                         "python-3.11", "--cpus", "1", "--idle-minutes", "45")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["idle_policy"]["idle_minutes"] == 45
    code, out, _ = cli("env", "list")
    assert code == 0 and out.splitlines()[0].split()[:2] == ["NAME", "STATUS"] and "box" in out

    code, _, err = cli("ssh", "--print", "box")
    assert code != 0 and "stopped; start it: gpugeek env start box" in err
    assert cli("env", "start", "box")[0] == 0
    advance_to(EnvironmentRow.objects.get(name="box").current_job, "running")
    code, out, err = cli("ssh", "--print", "-F", "my config", "box", "--", "ls", "-la")
    assert code == 0, err
    printed = shlex.split(out)
    assert printed[:4] == ["ssh", "-F", "my config", "-J"]
    assert printed[-3:] == ["job@box.acme", "ls", "-la"]
    code, out, _ = cli("--json", "env", "keep-alive", "box", "--minutes", "30")
    assert code == 0 and json.loads(out)["keep_alive_until"]
    assert cli("env", "stop", "box")[0] == 0
    advance_to(EnvironmentRow.objects.get(name="box").current_job, "cancelled")

    # Deleting the files too asks first; without a terminal it wants --yes.
    code, _, err = cli("env", "delete", "box", "--delete-volume")
    assert code == 2 and "--yes" in err
    assert cli("env", "delete", "box")[0] == 2  # keep or delete the volume: say which
    code, out, _ = cli("--json", "env", "delete", "box", "--delete-volume", "--yes")
    assert code == 0 and json.loads(out) == {"deleted": "box", "home_volume_kept": False}
    assert Volume.objects.get(name="box-home").deleted_at is not None
    assert cli("env", "get", "box")[0] == 4  # not found


def test_a_jupyter_environment_from_the_cli_answers_its_url_and_has_no_ssh(cli, world, keyed):  # noqa: F811
    code, out, err = cli("--json", "env", "create", "lab", "--region", "local", "--image",
                         "python-3.11", "--cpus", "1", "--interactive", "jupyter")  # fmt: skip
    assert code == 0, err
    created = json.loads(out)
    assert created["interactive"] == "jupyter" and created["ssh_command"] == ""
    assert created["jupyter_url"].endswith("/env/acme/lab/tree")
    assert cli("env", "start", "lab")[0] == 0
    advance_to(EnvironmentRow.objects.get(name="lab").current_job, "running")
    code, _, err = cli("ssh", "--print", "lab")
    assert code != 0 and "no SSH (only Jupyter: " in err
