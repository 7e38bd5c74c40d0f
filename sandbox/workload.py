"""What a sandbox pod does instead of running its command: a simulated training run.

The user's command is never executed (it is only echoed). Each pod plays one rank of a
training job: it prints realistic log lines at a steady rate (epoch, step, falling loss
with noise, throughput), "saves checkpoints" to the job's checkpoint path every
``SANDBOX_CHECKPOINT_SECONDS`` (30), reports per-GPU DCGM-style readings (see
`gpu_readings`), and ends after ``SANDBOX_DURATION_SECONDS`` (default 120) with exit
code 0, or fails with exit code 1 at ``SANDBOX_FAIL_AT`` seconds. A resumed attempt
(``GPUGEEK_RESUMED=1``) continues from the last step its job checkpointed, so a
preempted job finishes the remaining work.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sandbox import checkpoints as store
from sandbox import volume_fills
from sandbox.kubesim import PodRun

DEFAULT_DURATION_SECONDS = 120.0
STEPS_PER_SECOND = 2.0
LOG_EVERY_STEPS = 2  # one progress line a second
CHECKPOINT_EVERY_SECONDS = 30.0
EPOCHS = 5
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "huawei.com/Ascend910")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
RESUMED_ANNOTATION = "gpugeek.io/resumed"
# Board power of the simulated products, for readings that look like the real card.
POWER_LIMIT_W = {"H100": 700, "H200": 700, "A100": 400, "L40S": 350, "L4": 72, "MI300": 750}
MEMORY_GIB = re.compile(r"(\d+)\s*G[Bi]?", re.IGNORECASE)


def _float_env(env: dict[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(name, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def _resolve_env(pod: dict) -> dict[str, str]:
    """The main container's environment as the kubelet would resolve it: plain values
    (secret values the kubelet put in) and the downward-API fields we use (annotations)."""
    container = (pod.get("spec") or {}).get("containers", [{}])[0]
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
            continue
        path = (((entry.get("valueFrom") or {}).get("fieldRef")) or {}).get("fieldPath", "")
        match = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)
        if match:
            env[entry["name"]] = annotations.get(match[1], "")
    return env


def pod_gpu_count(pod: dict) -> int:
    total = 0
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        for which in ("limits", "requests"):
            amounts = resources.get(which) or {}
            found = [int(amounts[name]) for name in GPU_RESOURCES if name in amounts]
            if found:
                total += sum(found)
                break
    return total


@dataclass
class Run:
    """One rank of one attempt, as it plays out."""

    namespace: str
    pod: str
    job_key: str
    rank: int
    world_size: int
    gpus: int
    command: str
    checkpoint_path: str
    resumed: bool
    duration: float
    fail_at: float | None
    checkpoint_every: float
    first_step: int
    seed: int
    last_step: int = 0  # the step of the last progress line
    checkpoints: list[str] = field(default_factory=list)
    # The job's prefix in the console's checkpoint store (and what reaches it), if given.
    store_url: str = ""
    store_env: dict[str, str] = field(default_factory=dict)
    resume_from: str = ""
    # Its volumes: (mount path, the sandbox's folder of the claim, read-only).
    volumes: list[tuple[str, Path, bool]] = field(default_factory=list)
    job_id: str = ""
    attempt: str = ""

    @property
    def total_steps(self) -> int:
        return max(1, int(self.duration * STEPS_PER_SECOND))

    def step_at(self, elapsed: float) -> int:
        return min(self.total_steps, self.first_step + int(elapsed * STEPS_PER_SECOND))

    def loss_at(self, step: int) -> float:
        noise = random.Random(self.seed * 1_000_003 + step).gauss(0, 0.03)
        return 0.85 + 2.9 * math.exp(-step / (self.total_steps / 3 + 1)) + noise


class Workloads:
    """The simulated runs of every pod, and the last checkpoint of every job.

    Shared by the simulator's controller thread (`play`, tickers) and the metrics
    handler (`gpu_readings`): one lock guards both maps.
    """

    def __init__(self, *, clock: Callable[[], float], volume_root: Path | None = None) -> None:
        self._clock = clock
        # Where claims' data lives (the copy pods of volume fills write there); None: no
        # fill pod is run.
        self.volume_root = volume_root
        self._lock = threading.Lock()
        self._runs: dict[str, tuple[Run, float]] = {}  # pod uid -> (run, started at)
        self._checkpoints: dict[str, int] = {}  # job key -> last checkpointed step

    # --- the simulator's pod_script -------------------------------------------------------
    def play(self, pod: dict) -> PodRun:
        meta = pod["metadata"]
        env = _resolve_env(pod)
        if self.volume_root is not None and volume_fills.is_fill_pod(pod):
            return volume_fills.play_fill(pod, env, self.volume_root)
        labels = meta.get("labels") or {}
        job_key = f"{meta['namespace']}/{env.get('GPUGEEK_JOB_ID') or labels.get('job-name', '')}"
        rank = int(env.get("JOB_COMPLETION_INDEX") or 0) + int(env.get("GPUGEEK_RANK_OFFSET") or 0)
        duration = _float_env(env, "SANDBOX_DURATION_SECONDS", DEFAULT_DURATION_SECONDS) or 1.0
        fail_at = _float_env(env, "SANDBOX_FAIL_AT", None)
        resumed = env.get("GPUGEEK_RESUMED") == "1"
        container = pod["spec"]["containers"][0]
        resume_from = env.get("GPUGEEK_RESUME_FROM", "")
        stored = store.resume_step(resume_from, env) if resumed and resume_from else None
        with self._lock:
            first_step = self._checkpoints.get(job_key, 0) if resumed else 0
        if stored is not None:
            first_step = stored  # the console's store, as a real program would read it
        run = Run(
            namespace=meta["namespace"],
            pod=meta["name"],
            job_key=job_key,
            rank=rank,
            world_size=int(env.get("WORLD_SIZE") or 1),
            gpus=pod_gpu_count(pod),
            command=" ".join([*container.get("command", []), *container.get("args", [])]),
            checkpoint_path=env.get("GPUGEEK_CHECKPOINT_PATH", ""),
            resumed=resumed,
            duration=duration,
            fail_at=fail_at,
            checkpoint_every=_float_env(env, "SANDBOX_CHECKPOINT_SECONDS", CHECKPOINT_EVERY_SECONDS)
            or CHECKPOINT_EVERY_SECONDS,
            first_step=first_step,
            seed=int(hashlib.sha256(meta["uid"].encode()).hexdigest()[:8], 16),
            last_step=first_step,
            store_url=env.get("GPUGEEK_CHECKPOINT_URL", ""),
            store_env={
                k: v
                for k, v in env.items()
                if k.startswith("AWS_") or k.startswith("GPUGEEK_CHECKPOINT_")
            },
            resume_from=resume_from if stored is not None else "",
            volumes=(
                volume_fills.claim_mounts(pod, self.volume_root)
                if self.volume_root is not None
                else []
            ),
            job_id=env.get("GPUGEEK_JOB_ID", ""),
            attempt=env.get("GPUGEEK_ATTEMPT", ""),
        )
        remaining = max(0.5, (run.total_steps - first_step) / STEPS_PER_SECOND)
        ends_in, exit_code = remaining, 0
        if fail_at is not None and fail_at < remaining:
            ends_in, exit_code = max(0.5, fail_at), 1
        with self._lock:
            self._runs[meta["uid"]] = (run, self._clock())
        return PodRun(
            duration=ends_in,
            exit_code=exit_code,
            logs=self._banner(run),
            ticker=lambda elapsed: self._tick(meta["uid"], elapsed, ends_in, exit_code),
        )

    @staticmethod
    def _banner(run: Run) -> list[str]:
        lines = [
            "[sandbox] Simulated workload: nothing runs on real GPUs and your command is "
            "not executed.",
            f"[sandbox] command: {run.command[:300]}",
            f"rank {run.rank}/{run.world_size}: {run.gpus} GPU(s) visible, NCCL initialised",
        ]
        if run.resumed:
            where = run.checkpoint_path or run.resume_from or "(no checkpoint path)"
            lines.append(f"GPUGEEK_RESUMED=1: resuming from {where} at step {run.first_step}")
            if run.resume_from:
                lines.append(f"GPUGEEK_RESUME_FROM={run.resume_from}")
        for path, folder, read_only in run.volumes:
            access = " (read-only)" if read_only else ""
            lines.append(f"volume {path}{access}: {volume_fills.describe(folder)}")
        return lines

    def _tick(self, uid: str, elapsed: float, ends_in: float, exit_code: int) -> Iterable[str]:
        with self._lock:
            entry = self._runs.get(uid)
        if entry is None:
            return []
        run = entry[0]
        lines: list[str] = []
        step = run.step_at(min(elapsed, ends_in))
        while run.last_step + LOG_EVERY_STEPS <= step:
            run.last_step += LOG_EVERY_STEPS
            lines.append(self._progress_line(run, run.last_step))
        due = int(min(elapsed, ends_in) // run.checkpoint_every)
        while len(run.checkpoints) < due:
            lines.extend(self._checkpoint(run, step))
        if elapsed >= ends_in:
            if exit_code == 0 and run.rank == 0:
                lines.extend(self._write_outputs(run))
            lines.append(self._ending(run, exit_code))
            with self._lock:
                self._runs.pop(uid, None)
        return lines

    def _progress_line(self, run: Run, step: int) -> str:
        rng = random.Random(run.seed + step)
        throughput = 3100 * max(1, run.gpus) * rng.uniform(0.93, 1.04)
        return (
            f"epoch {min(EPOCHS, step * EPOCHS // run.total_steps + 1)}/{EPOCHS} "
            f"step {step}/{run.total_steps} "
            f"loss {run.loss_at(step):.4f} lr 3.0e-04 "
            f"throughput {throughput:,.0f} tokens/s (rank {run.rank})"
        )

    def _checkpoint(self, run: Run, step: int) -> list[str]:
        stored = self._store_checkpoint(run, step) if run.store_url else []
        target = f"{run.checkpoint_path.rstrip('/')}/step-{step:06d}" if run.checkpoint_path else ""
        run.checkpoints.append(target or f"step-{step:06d}")
        if run.rank == 0:
            with self._lock:
                self._checkpoints[run.job_key] = max(self._checkpoints.get(run.job_key, 0), step)
        if not target:
            return stored or [f"step {step}: no checkpoint path configured, checkpoint skipped"]
        # The store's own line names the manifest; a path's line replaces it (the event's stays).
        return [f"saved checkpoint {target} (rank {run.rank})", *stored[1:]]

    @staticmethod
    def _store_checkpoint(run: Run, step: int) -> list[str]:
        """Rank 0 writes the checkpoint to the console's store and posts the job's
        `checkpoint` event; what to log (nothing for the other ranks)."""
        if run.rank != 0:
            return []
        try:
            manifest = store.save(
                run.store_url, run.store_env, step=step, rank=run.rank, loss=run.loss_at(step)
            )
        except Exception as error:  # the store is unreachable: training goes on
            return [f"step {step}: checkpoint to the store failed: {error}"]
        event = store.notify(run.store_env, step=step)
        return [f"saved checkpoint {manifest} (rank {run.rank})", *([event] if event else [])]

    @staticmethod
    def _write_outputs(run: Run) -> list[str]:
        text = (
            f"simulated training output of job {run.job_id}, attempt {run.attempt}: "
            f"{run.total_steps} steps, final loss {run.loss_at(run.total_steps):.4f}\n"
        )
        lines = []
        for path, folder, read_only in run.volumes:
            if read_only:
                continue
            relative = volume_fills.write_output(
                folder, job_id=run.job_id, attempt=run.attempt, text=text
            )
            lines.append(f"wrote {path.rstrip('/')}/{relative}")
        return lines

    @staticmethod
    def _ending(run: Run, exit_code: int) -> str:
        if exit_code:
            return (
                "RuntimeError: CUDA error: an illegal memory access was encountered "
                "(simulated by SANDBOX_FAIL_AT)"
            )
        final_loss = run.loss_at(run.total_steps)
        return f"training complete: {run.total_steps} steps, final loss {final_loss:.4f}"

    # --- metrics --------------------------------------------------------------------------
    def gpu_readings(
        self, products: dict[str, str]
    ) -> list[tuple[str, str, int, dict[str, float]]]:
        """(namespace, pod, gpu index, DCGM field values) of every running GPU pod.

        `products` maps each running pod's uid → its node's GPU product label (memory
        and power follow the product, e.g. 80 GB and 700 W for an H100)."""
        now = self._clock()
        with self._lock:
            # Runs of pods that ended early (evicted, deleted, node failed) are dropped.
            for gone in set(self._runs) - set(products):
                del self._runs[gone]
            runs = list(self._runs.items())
        readings = []
        for uid, (run, started) in runs:
            product = products[uid]
            elapsed = now - started
            for gpu in range(run.gpus):
                rng = random.Random(f"{run.seed}:{gpu}:{int(elapsed)}")
                # Utilisation dips while a checkpoint is written (a few seconds each), by
                # less than the console's alert rule reads as unstable (jobs.alerts: a
                # std-dev over 15 points; these readings can't spread that far).
                saving = elapsed % run.checkpoint_every > run.checkpoint_every - 3
                utilization = rng.uniform(72, 82) if saving else rng.uniform(88, 99)
                # Memory fills while the model loads (two seconds), then holds: a longer
                # ramp reads as a leak to the console's alert rule (jobs.alerts), which
                # would warn on every sandbox job.
                share = min(0.93, 0.35 + 0.5 * min(1.0, elapsed / 2))
                fields = dcgm_fields(product, utilization, share, rng)
                readings.append((run.namespace, run.pod, gpu, fields))
        return readings

    @staticmethod
    def serving_readings(
        products: dict[str, str], serving: Iterable[tuple[str, str, str, int, float]]
    ) -> list[tuple[str, str, int, dict[str, float]]]:
        """(namespace, pod, gpu index, DCGM field values) of the serving pods' GPUs.

        `serving` holds (uid, namespace, pod, GPUs, percent busy) of each serving pod
        with GPUs, busy as its requests keep it (the simulator counts them); its model
        holds most of the memory from the start."""
        readings = []
        for uid, namespace, pod, gpus, utilization in serving:
            if uid not in products:
                continue
            for gpu in range(gpus):
                rng = random.Random(f"{uid}:{gpu}:{int(utilization)}")
                fields = dcgm_fields(products[uid], utilization, 0.85, rng)
                readings.append((namespace, pod, gpu, fields))
        return readings


def dcgm_fields(
    product: str, utilization: float, memory_share: float, rng: random.Random
) -> dict[str, float]:
    """The DCGM field values of one GPU of `product`, `utilization` percent busy with
    `memory_share` of its memory used (memory and power follow the product)."""
    memory_mib = _memory_gib(product) * 1024
    power_limit = next((w for k, w in POWER_LIMIT_W.items() if k in product.upper()), 500)
    used = memory_mib * memory_share
    return {
        "DCGM_FI_DEV_GPU_UTIL": round(utilization),
        "DCGM_FI_DEV_FB_USED": round(used),
        "DCGM_FI_DEV_FB_FREE": round(memory_mib - used),
        # An idle GPU still draws a little of its board power.
        "DCGM_FI_DEV_POWER_USAGE": round(
            power_limit * max(utilization, 8) / 100 * rng.uniform(0.85, 0.95), 1
        ),
        "DCGM_FI_DEV_GPU_TEMP": round(38 + 36 * utilization / 100 + rng.uniform(-1, 1)),
    }


def _memory_gib(product: str) -> int:
    match = MEMORY_GIB.search(product)
    return int(match[1]) if match else 80
