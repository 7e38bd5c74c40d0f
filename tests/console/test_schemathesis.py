"""The API against its own OpenAPI schema: schemathesis (`st run --checks all`) fuzzes
every operation the schema lists, as the owner of an organisation with a bearer token,
on a real server (uvicorn, as deployed) over the test database, and follows the
schema's links from each create to what reads, acts on and deletes the object.

Three runs, each its own test: as the owner with a fixed seed (the same cases every
time, so a failure reproduces), as the owner with a short one seeded by the commit (new
cases for each commit; the seed is printed), and as platform staff on the staff
operations. Each must find
nothing: no server error, no undocumented status, no response off its schema, no
schema-valid request refused or invalid one accepted, beyond what
tests/console/schemathesis.toml allows, each with its reason."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from console.launcher import free_loopback_port
from console.services.tokens import api_token_create
from tests.factories import UserFactory
from tests.servers import ROOT, child_env, started_child

pytestmark = pytest.mark.integration

CONFIG = Path(__file__).with_name("schemathesis.toml")
FIXED_SEED = 20261201
# Cases per operation: enough to cover each operation's parameters, body fields and
# links on this 2-core CI box in about a minute per run.
FIXED_EXAMPLES = 10
RANDOM_EXAMPLES = 4
# Each run is its own test with its own limit: a slow CI host took over 300 s (the suite's
# default limit) for the three together.
SCHEMATHESIS_LIMIT = 900
STAFF_PATHS = r"^/api/v1/(staff|sandbox|invoices|price-versions|gpu-types|regions)"


@pytest.fixture
def api_server(transactional_db, tmp_path):
    port = free_loopback_port()
    argv = [
        sys.executable, "-m", "uvicorn", "console.asgi:application",
        "--host", "127.0.0.1", "--port", str(port), "--no-access-log",
    ]  # fmt: skip
    with started_child(
        argv, child_env(), tmp_path / "uvicorn.log", ready="Uvicorn running", what="uvicorn"
    ) as server:
        server.url = f"http://127.0.0.1:{port}"
        yield server


def _schemathesis(
    url: str, token: str, *, seed: int, examples: int, reports: Path, only: str = ""
) -> str:
    st = Path(sys.executable).with_name("st")
    argv = [
        str(st), "--config-file", str(CONFIG), "run", f"{url}/api/v1/schema/?format=json",
        "--checks", "all", "--header", f"Authorization: Bearer {token}",
        "--seed", str(seed), "--max-examples", str(examples), "--workers", "1",
        "--generation-database", "none", "--request-timeout", "20", "--no-color",
        "--report", "junit", "--report-dir", str(reports),
        *(["--include-path-regex", only] if only else []),
    ]  # fmt: skip
    limit = SCHEMATHESIS_LIMIT - 60
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    output = run.stdout + run.stderr
    summary = re.search(r"Tested: (\d+).*?(\d+) generated, (.*?)\n", output, re.S)
    if summary:
        operations, cases, outcome = summary.groups()
        print(f"schemathesis seed {seed}: {operations} operations, {cases} cases: {outcome}")
    assert run.returncode == 0, output[-20000:]
    assert summary is not None and int(summary.group(1)) >= (20 if only else 60), output[-5000:]
    return output


def _commit_seed() -> int:
    """New cases for every commit, the same for every run of one commit: what CI runs on
    a commit is what was run on it before it landed. The seed is printed."""
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return int(head[:8], 16) if re.fullmatch(r"[0-9a-f]{40}", head) else FIXED_SEED + 1


@pytest.mark.timeout(SCHEMATHESIS_LIMIT)
def test_the_api_keeps_to_its_schema_under_schemathesis(api_server, world, catalog, tmp_path):
    _, token = api_token_create(user=world.owner, tenant=world.tenant, name="schemathesis")
    _schemathesis(
        api_server.url, token, seed=FIXED_SEED, examples=FIXED_EXAMPLES, reports=tmp_path / "a"
    )
    assert "Traceback" not in api_server.log(), api_server.log()[-5000:]


@pytest.mark.timeout(SCHEMATHESIS_LIMIT)
def test_the_api_keeps_to_its_schema_with_cases_seeded_by_the_commit(
    api_server, world, catalog, tmp_path
):
    _, token = api_token_create(user=world.owner, tenant=world.tenant, name="schemathesis")
    _schemathesis(
        api_server.url, token, seed=_commit_seed(), examples=RANDOM_EXAMPLES, reports=tmp_path
    )
    assert "Traceback" not in api_server.log(), api_server.log()[-5000:]


@pytest.mark.timeout(SCHEMATHESIS_LIMIT)
def test_the_staff_api_keeps_to_its_schema_under_schemathesis(api_server, world, catalog, tmp_path):
    """Platform staff with a staff automation token on what only staff may do (tenants,
    pools, price book, invoices, sandbox); it may suspend the organisation."""
    staff = UserFactory(is_staff=True)
    _, staff_token = api_token_create(user=staff, tenant=None, name="schemathesis-staff")
    _schemathesis(
        api_server.url,
        staff_token,
        seed=FIXED_SEED,
        examples=FIXED_EXAMPLES,
        reports=tmp_path,
        only=STAFF_PATHS,
    )
    assert "Traceback" not in api_server.log(), api_server.log()[-5000:]
