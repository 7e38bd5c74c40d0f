"""The copy pod of a volume fill, run for real in the sandbox: the console's own program
(`python -m storage.fill_pod`, the container's command) in a process with the pod's
environment only, writing to the folder the sandbox keeps for the volume's claim
(`<volume root>/<namespace>/<claim name>`), so what a fill copies stays there as a
volume's data does. Only the console's fill pods (their label, their one command) are
run: a tenant's command never is. Deleting the pod kills the process.

The simulated training pods use the same folders: they list what their volumes hold at
start and, on success, rank 0 writes a small output file into each read-write one, so a
volume's data is seen to outlive the job that wrote it."""

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


def claim_mounts(pod: dict, volume_root: Path) -> list[tuple[str, Path, bool]]:
    """(mount path, the sandbox's folder of its claim, read-only) of each claim the pod's
    main container mounts; the folders are made if need be."""
    spec = pod.get("spec") or {}
    claims = {
        volume["name"]: volume["persistentVolumeClaim"]
        for volume in spec.get("volumes") or []
        if volume.get("persistentVolumeClaim", {}).get("claimName")
    }
    mounts = []
    for mount in ((spec.get("containers") or [{}])[0]).get("volumeMounts") or []:
        claim = claims.get(mount.get("name"))
        if claim is None:
            continue
        folder = volume_root / pod["metadata"]["namespace"] / claim["claimName"]
        folder.mkdir(parents=True, exist_ok=True)
        read_only = bool(mount.get("readOnly") or claim.get("readOnly"))
        mounts.append((mount["mountPath"], folder, read_only))
    return mounts


def describe(folder: Path, shown: int = 5) -> str:
    """What a claim's folder holds, for a log line: files, bytes, the first names."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    if not files:
        return "empty"
    size = sum(p.stat().st_size for p in files)
    names = ", ".join(p.relative_to(folder).as_posix() for p in files[:shown])
    more = f" and {len(files) - shown} more" if len(files) > shown else ""
    return f"{len(files)} file(s), {size:,} bytes: {names}{more}"


def write_output(folder: Path, *, job_id: str, attempt: str, text: str) -> str:
    """The simulated job's output file in a read-write volume; its path in the volume."""
    relative = f"sandbox-outputs/job-{job_id or 'unknown'}/attempt-{attempt or '1'}.txt"
    target = folder / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return relative


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
    mounts = claim_mounts(pod, volume_root)
    if not mounts:
        return PodRun(duration=0.5, exit_code=1, logs=['{"error": "No volume is mounted."}'])
    run = FillProcess(env, mounts[0][1])
    return PodRun(duration=None, ticker=run.ticker, exited=run.exited, stop=run.stop)
