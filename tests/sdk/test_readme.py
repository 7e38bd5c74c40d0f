"""The README's Python examples work as written: every ```python block marked
`<!-- readme: run -->` runs, unchanged, in its own interpreter against a real console
(uvicorn, a Celery worker and the watcher on the test database; the SDK from its source
tree, configured by GPUGEEK_URL / GPUGEEK_TOKEN as the README says)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sdk.conftest import SRC
from tests.servers import celery_worker_process, watcher_process  # noqa: F401

README = Path(__file__).resolve().parents[2] / "README.md"
RUNNABLE = re.compile(r"^<!-- readme: run -->\n```python\n(.*?)^```$", re.M | re.S)


def runnable_blocks() -> list[str]:
    return RUNNABLE.findall(README.read_text())


def test_the_readme_marks_its_sdk_example_runnable():
    blocks = runnable_blocks()
    assert blocks, "no README block is marked <!-- readme: run -->"
    assert any("cluster.pause()" in block and "cluster.resume()" in block for block in blocks)


@pytest.mark.parametrize("index", range(len(runnable_blocks())))
def test_readme_block_runs_as_written(
    index,
    gg,
    celery_worker_process,  # noqa: F811
    watcher_process,  # noqa: F811
    tmp_path,
):
    block = runnable_blocks()[index]
    env = {**os.environ, "PYTHONPATH": str(SRC)}  # gg set GPUGEEK_URL and GPUGEEK_TOKEN
    env.pop("DJANGO_SETTINGS_MODULE", None)
    ran = subprocess.run(
        [sys.executable, "-c", block],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ran.returncode == 0, f"README block {index} failed:\n{ran.stdout}\n{ran.stderr}"
    lines = ran.stdout.splitlines()
    if "cluster.pause()" in block:
        # Ran twice (paused, then resumed from the start: no checkpoint here), to the end.
        assert lines.count("step 0") >= 1 and "step 9" in lines, ran.stdout
        status, cost = lines[-1].split()
        assert status == "succeeded", ran.stdout
        assert float(cost) >= 0
