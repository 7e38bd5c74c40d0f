"""The copy pod of a volume fill, run for real in the sandbox: the console's own program
(`python -m storage.fill_pod`, the container's command) in a process with the pod's
environment only, writing to the folder the sandbox keeps for the volume's claim
(`<volume root>/<namespace>/<claim name>`), so what a fill copies stays there as a
volume's data does. Only the console's fill pods (their label, their one command) are
run: a tenant's command never is. Deleting the pod kills the process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from sandbox.kubesim import PodRun

FILL_LABEL = "gpugeek.io/volume-fill"
FILL_COMMAND = ["python", "-m", "storage.fill_pod"]
REPOSITORY = Path(__file__).resolve().parents[1]


def is_fill_pod(pod: dict) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return FILL_LABEL in labels and containers[0].get("command") == FILL_COMMAND


def claim_folder(pod: dict, volume_root: Path) -> Path | None:
    """The sandbox's folder of the claim the pod mounts, made if need be."""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            folder = volume_root / pod["metadata"]["namespace"] / claim
            folder.mkdir(parents=True, exist_ok=True)
            return folder
    return None


class FillProcess:
    """The copy's process and the log lines it wrote that the kubelet hasn't taken yet."""

    def __init__(self, env: dict[str, str], folder: Path):
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "storage.fill_pod"],
            cwd=REPOSITORY,
            env={
                **env,
                "GPUGEEK_FILL_TARGET": str(folder),
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "PYTHONPATH": str(REPOSITORY),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            with self._lock:
                self._lines.append(line.rstrip("\n"))

    def ticker(self, elapsed: float) -> list[str]:
        with self._lock:
            lines, self._lines = self._lines, []
        return lines

    def exited(self) -> int | None:
        """The exit code once the process ended and its output was all read."""
        code = self.process.poll()
        if code is None or self._reader.is_alive():
            return None
        return code

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def play_fill(pod: dict, env: dict[str, str], volume_root: Path) -> PodRun:
    folder = claim_folder(pod, volume_root)
    if folder is None:
        return PodRun(duration=0.5, exit_code=1, logs=['{"error": "No volume is mounted."}'])
    run = FillProcess(env, folder)
    return PodRun(duration=None, ticker=run.ticker, exited=run.exited, stop=run.stop)
