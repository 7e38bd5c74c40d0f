"""The CLI against the real server: `main(argv)` in-process, and once as a process."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from decimal import Decimal

import pytest
from gpugeek import output
from gpugeek.cli import _launch_notes, main
from gpugeek.models import Job

from tests.sdk.conftest import SRC, dispatch

pytestmark = pytest.mark.integration


@pytest.fixture
def cli(gg, tmp_path, monkeypatch, capsys):
    """Run `gpugeek ARGS…` in-process: (exit code, stdout, stderr)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_launch_status_ls_cancel_json(cli):
    code, out, _ = cli("--json", "launch", "--name", "from cli", "--image", "python-3.11",
                       "--region", "local", "--cpus", "1", "--env", "A=1",
                       "--", "python", "-c", "print('hi')")  # fmt: skip
    assert code == 0
    job = json.loads(out)
    assert (job["name"], job["region"], job["env"], job["command"]) == (
        "from cli",
        "local",
        {"A": "1"},
        ["python", "-c", "print('hi')"],
    )
    code, out, _ = cli("--json", "status", str(job["id"]))
    assert code == 0 and json.loads(out)["id"] == job["id"]
    code, out, _ = cli("--json", "ls")
    assert code == 0 and [row["id"] for row in json.loads(out)] == [job["id"]]
    code, out, _ = cli("ls", "--json")  # also after the command
    assert code == 0 and [row["id"] for row in json.loads(out)] == [job["id"]]
    code, out, _ = cli("ls")  # a human table
    assert code == 0 and out.splitlines()[0].split()[:3] == ["ID", "NAME", "STATUS"]
    assert "from cli" in out
    code, out, _ = cli("--json", "pause", str(job["id"]))  # queued: 409
    assert code == 6
    code, out, _ = cli("--json", "cancel", str(job["id"]))
    assert code == 0 and json.loads(out)["status"] == "cancelled"


def test_a_human_launch_says_its_price_and_whether_it_is_simulated(cli):
    code, out, _ = cli("launch", "--name", "plain", "--image", "python-3.11",
                       "--region", "local", "--cpus", "1", "--", "true")  # fmt: skip
    assert code == 0
    job_id = re.search(r"^id\s+(\d+)$", out, re.M)[1]
    code, answer, _ = cli("--json", "status", job_id)
    job = json.loads(answer)
    assert job["simulated"] is False and "Simulated:" not in out
    assert job["currency"] == "USD"
    nodes = "(0 spot + 1 on-demand node(s))"
    price = output.money(job["price_per_hour"], "USD")
    assert re.fullmatch(r"\d+\.\d\d USD", price)
    assert f"Price: {price} per hour while running {nodes}" in out
    # People read money as the console shows it; --json keeps the API's precision.
    code, out, _ = cli("status", job_id)
    assert re.search(r"^cost_to_date\s+\d+\.\d\d USD$", out, re.M), out
    assert re.search(r"^price_per_hour\s+\d+\.\d\d USD$", out, re.M), out
    code, out, _ = cli("ls")
    assert re.search(r"\b\d+\.\d\d USD\b", out) and ".000000" not in out, out


def test_a_launch_on_the_simulated_cluster_says_so(capsys):
    # What `gpugeek launch` prints below the job the API answered (here one on the
    # sandbox cluster, as tests/jobs/test_api.py has the API answer for such a launch).
    job = Job.from_dict({"id": 7, "simulated": True, "price_per_hour": "6.4400",
                         "currency": "USD", "spot_nodes": 1, "on_demand_nodes": 0})  # fmt: skip
    _launch_notes(job)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "Price: 6.44 USD per hour while running (1 spot + 0 on-demand node(s))",
        "Simulated: this job runs on the sandbox cluster's simulated nodes; "
        "its command is not executed.",
    ]


def test_exit_codes(cli, asgi_server):
    code, _, err = cli("status", "987654")
    assert code == 4 and "NotFound" in err
    code, _, err = cli("--token", "ggt_wrong", "ls")
    assert code == 3 and "AuthenticationError" in err
    code, _, err = cli("--json", "launch", "--image", "no-such-image", "--region", "local",
                       "--cpus", "1", "--", "true")  # fmt: skip
    assert code == 1
    body = json.loads(err)
    assert body["error"] == "ValidationError" and body["status"] == 400 and body["exit_code"] == 1
    # The flag reaches the server, which says why (a CPU job declares no GPU memory).
    code, _, err = cli("--json", "launch", "--image", "python-3.11", "--region", "local",
                       "--cpus", "1", "--gpu-memory-gib", "8", "--", "true")  # fmt: skip
    assert code == 1 and "GPU memory is declared only for a GPU job" in err
    assert cli("launch", "--image", "python-3.11")[0] == 2  # no command
    assert cli("no-such-command")[0] == 2
    assert cli("status", "not-a-number")[0] == 2
    assert cli("--url", "http://127.0.0.1:9", "--token", "t", "ls")[0] == 8


def test_launch_from_yaml_spec_logs_and_wait(cli, tmp_path, watcher_process):
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: yaml job\nimage: python-3.11\nregion: local\ncpus: 1\n"
        "command: [python, -c, 'for n in range(1, 41): print(f\"row {n}\")']\n"
    )
    code, out, _ = cli("--json", "launch", "-f", str(spec))
    assert code == 0
    job = json.loads(out)
    assert job["name"] == "yaml job"
    dispatch(job["id"])
    code, out, _ = cli("logs", str(job["id"]), "-f", "--timeout", "60")
    assert code == 0 and out.splitlines() == [f"row {n}" for n in range(1, 41)]
    code, out, _ = cli("--json", "logs", str(job["id"]), "--since-line", "38")
    assert [json.loads(line)["line_no"] for line in out.splitlines()] == [39, 40]
    code, out, _ = cli("--json", "status", str(job["id"]))
    assert json.loads(out)["status"] == "succeeded"


def test_offers_estimate_costs_invoices(cli):
    code, out, _ = cli("--json", "offers", "--gpu-type", "a100-80gb", "--region", "us-west")
    assert code == 0 and {row["gpu_type"] for row in json.loads(out)} == {"a100-80gb"}
    code, out, _ = cli("offers", "--no-cpu")
    assert code == 0 and "a100-80gb" in out and "PRICE_PER_GPU_HOUR" in out
    code, out, _ = cli("--json", "estimate", "--gpu-type", "A100-80GB", "--count", "16",
                       "--region", "us-west", "--hours", "3")  # fmt: skip
    assert code == 0 and json.loads(out)["units"] == 16
    assert cli("estimate", "--gpu-type", "A100-80GB", "--count", "8")[0] == 2  # no region
    code, out, _ = cli("--json", "costs")
    assert code == 0 and isinstance(json.loads(out), dict)
    code, out, _ = cli("costs")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("Month to date (since ")
    assert lines[0].endswith(" 0.00 USD")
    assert "per hour" in lines[1] and "Forecast for the month" in lines[2]
    assert re.search(r"\d\.\d{3}", out) is None  # money with two decimals, never twelve
    code, out, _ = cli("--json", "invoices")
    assert code == 0 and json.loads(out) == []
    assert cli("invoices") == (0, "(none)\n", "")


def test_login_stores_a_private_config(cli, asgi_server, api_token, tmp_path, monkeypatch):
    monkeypatch.delenv("GPUGEEK_TOKEN")
    monkeypatch.delenv("GPUGEEK_URL")
    code, _, err = cli("ls")
    assert code == 3 and "login" in err
    code, out, _ = cli("login", "--url", asgi_server.url, "--token", api_token)
    assert code == 0 and "owner@acme.test" in out
    path = tmp_path / "config" / "gpugeek" / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"url": asgi_server.url, "token": api_token}
    assert cli("--json", "ls") == (0, "[]\n", "")
    assert cli("login", "--url", asgi_server.url, "--token", "ggt_bad")[0] == 3


def test_as_a_process(asgi_server, api_token, tmp_path):
    """`python -m gpugeek` (what the installed `gpugeek` script runs) in a child process."""
    env = dict(os.environ, GPUGEEK_URL=asgi_server.url, GPUGEEK_TOKEN=api_token,
               PYTHONPATH=str(SRC), XDG_CONFIG_HOME=str(tmp_path))  # fmt: skip
    run = [sys.executable, "-m", "gpugeek"]
    done = subprocess.run([*run, "--json", "ls"], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    done = subprocess.run([*run, "status", "424242"], env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 4 and "NotFound" in done.stderr
    done = subprocess.run([*run, "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Exit codes" in done.stdout
    # A reader that has gone away (`gpugeek ls | head -1`): no traceback, success.
    child = subprocess.Popen([*run, "ls"], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)  # fmt: skip
    child.stdout.close()  # before the child writes its table
    _, err = child.communicate(timeout=60)
    assert child.returncode == 0 and "Traceback" not in err, err


def test_yaml_spec_without_pyyaml_says_so(cli, tmp_path, monkeypatch):
    spec = tmp_path / "spec.yaml"
    spec.write_text("image: python-3.11\ncommand: [true]\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    code, _, err = cli("launch", "-f", str(spec))
    assert code == 2 and "PyYAML" in err
    as_json = tmp_path / "spec.json"
    as_json.write_text(json.dumps({"image": "python-3.11", "region": "local", "cpus": 1,
                                   "command": ["true"]}))  # fmt: skip
    code, out, _ = cli("--json", "launch", "-f", str(as_json))
    assert code == 0 and json.loads(out)["image"] == "python-3.11"


def test_launch_wait_times_out_with_exit_5(cli):
    # Nothing dispatches this job (no worker here): it stays queued/dispatching.
    code, _, err = cli("launch", "--wait", "--timeout", "1", "--image", "python-3.11",
                       "--region", "local", "--cpus", "1", "--", "true")  # fmt: skip
    assert code == 5 and "Timeout" in err
    assert "job " in err.splitlines()[0]  # the progress line before it


def test_budget_set_creates_changes_and_deletes(cli):
    code, out, _ = cli("--json", "budget", "set", "GPU spend", "--amount", "1500",
                       "--action", "warn", "--thresholds", "50, 90")  # fmt: skip
    assert code == 0
    budget = json.loads(out)
    assert (budget["name"], Decimal(budget["amount"]), budget["action"], budget["thresholds"]) == (
        "GPU spend", Decimal(1500), "alert_only", [50, 90]
    )  # fmt: skip
    assert budget["period"] == "monthly"
    code, out, _ = cli("--json", "budget", "set", "GPU spend", "--action", "pause",
                       "--project", "vision", "--period", "monthly")  # fmt: skip
    changed = json.loads(out)
    assert code == 0 and changed["id"] == budget["id"]
    assert (changed["action"], changed["project"], Decimal(changed["amount"])) == (
        "pause_non_critical", "vision", Decimal(1500)
    )  # fmt: skip
    code, out, _ = cli("budgets")
    assert code == 0 and out.splitlines()[0].split()[:5] == ["ID", "NAME", "AMOUNT", "CURRENCY",
                                                             "PERIOD"]  # fmt: skip
    assert "GPU spend" in out and "50 90" in out
    code, out, _ = cli("budget", "set", "GPU spend", "--amount", "2000")  # a human summary
    assert code == 0 and "2000" in out and "pause_non_critical" in out

    assert cli("budget", "set", "GPU spend", "--thresholds", "fifty")[0] == 2
    assert cli("budget", "set", "GPU spend", "--action", "explode")[0] == 2
    code, _, err = cli("--json", "budget", "set", "Other", "--amount", "-5")
    assert code == 1 and "amount" in json.loads(err)["errors"]
    code, _, err = cli("budget", "set", "Other")  # a new budget needs an amount
    assert code == 1 and "amount" in err

    code, out, _ = cli("budget", "delete", "GPU spend")
    assert code == 0 and "GPU spend" in out
    assert cli("--json", "budgets") == (0, "[]\n", "")
    code, _, err = cli("budget", "delete", "GPU spend")
    assert code == 4 and "NotFound" in err
