"""Per-job supervisor of the local backend: `python -I local_supervisor.py RUN_DIR WORKDIR`.

It detaches from whoever started it (double fork, new session), so a Celery pool recycling
or a console restart never loses the job's exit code. It runs as the console's user and
keeps the job's control files in the run directory, which only that user can open; the
job's process gets only its working directory, runs as `--user` where one is given, and
never sees a file the console reads back as control data.

The command and the job's environment come as JSON on stdin, never in argv (where `ps`
shows them) or in the supervisor's own environment (a job's LD_PRELOAD must not load into
a process of the console's user). The command runs as argv (never through a shell) in its
own process group; its output comes through a pipe and the supervisor appends it to the
log, so the job can't rewrite earlier lines.

Under the run directory's lock it starts the command only if no other supervisor of this
run did, and only if the console has not asked the job to stop meanwhile (`intent`); the
console's cancel takes the same lock before it looks for the process to signal.

Files in the run directory: lock, intent (console), supervisor.pid, child.pid, exit_code
or not_started, output.log.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

PIPE_CHUNK = 1 << 16
# How often the sandbox's limits are checked (the work dir's size every DISK_POLL_ROUNDS).
LIMIT_POLL_SECONDS = 0.25
DISK_POLL_ROUNDS = 8
# Room above the task limit so the watcher sees a fork bomb reach it and stops the job.
TASK_HEADROOM = 32
STOP_INTENTS = {"pause": "paused", "cancel": "cancelled"}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _credentials(user: str | None) -> dict:
    """Popen arguments that drop the job to `user` (uid, its group, no other groups)."""
    if not user:
        return {}
    entry = pwd.getpwnam(user)
    if entry.pw_uid == os.geteuid():
        return {}
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _copy_output(read_fd: int, log, max_bytes: int) -> None:
    """Copy the job's output into the log until it holds one byte past the cap (readers
    then show it truncated); later output is drained and dropped, so the job never blocks
    on a full pipe. A resumed attempt appends: the cap counts what is there."""
    size = os.fstat(log.fileno()).st_size
    while True:
        try:
            data = os.read(read_fd, PIPE_CHUNK)
        except OSError:
            return
        if not data:
            return
        room = max_bytes + 1 - size
        if room > 0:
            kept = data[:room]
            log.write(kept)
            size += len(kept)


class Sandbox:
    """One job's bubblewrap sandbox, as `jobs.backends.local_sandbox.sandbox_plan` says.

    bwrap runs as the job's unprivileged uid (dropped here, before bwrap starts, so the
    kernel checks that uid outside the namespaces too) with the plan's rlimits. Its
    options and the job's environment (secrets included) reach it through a memfd
    (`--args`), never argv. The job's first process waits (`--block-fd`) until its
    network is set up: slirp4netns (run here, sandboxed and under seccomp) and routes
    that refuse the denied networks inside the job's network namespace, where the job has
    no capability to change them. `init_pid` is the sandbox's PID 1 (host pid): when it
    dies the kernel kills every process in the sandbox, whatever they did with sessions
    or forks."""

    def __init__(self, plan: dict, command: list[str], output_fd: int):
        self.plan = plan
        self.limits = plan["limits"]
        self.slirp: subprocess.Popen | None = None
        self._slirp_exit_w: int | None = None
        info_r, info_w = os.pipe()
        block_r, self._block_w = os.pipe()
        fds = [info_w, block_r]
        args = list(plan["args"])
        for path, text in plan["files"].items():
            fd = _memfd(text.encode())
            fds.append(fd)
            args += ["--ro-bind-data", str(fd), path]
        args += ["--info-fd", str(info_w), "--block-fd", str(block_r)]
        args_fd = _memfd(b"".join(arg.encode() + b"\0" for arg in args))
        fds.append(args_fd)
        uid, gid = plan["uid"], plan["gid"]
        self.process = subprocess.Popen(  # noqa: S603  (argv from the console's plan)
            # bwrap reads no command from --args: the command (argv, as without a
            # sandbox) follows; the environment and secrets stay in the memfd.
            [plan["bwrap"], "--args", str(args_fd), "--", *command],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
            stdout=output_fd,
            stderr=output_fd,
            pass_fds=fds,
            start_new_session=True,
            umask=0o077,
            preexec_fn=self._rlimits,  # the supervisor has no other thread yet
            **({"user": uid, "group": gid, "extra_groups": []} if uid is not None else {}),
        )
        for fd in fds:
            os.close(fd)
        self.init_pid = _read_info(info_r)
        os.close(info_r)

    def _rlimits(self) -> None:
        # Memory: the watcher stops the job at its limit with the reason; the address
        # space a job may reserve without touching (CUDA, allocators) stays larger.
        limit = self.limits["memory_bytes"] * 2
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        disk = self.limits["disk_bytes"] + 1
        resource.setrlimit(resource.RLIMIT_FSIZE, (disk, disk))
        if self.plan["uid"] is not None:  # counted per uid: only with the job's own uid
            tasks = self.limits["processes"] + TASK_HEADROOM
            resource.setrlimit(resource.RLIMIT_NPROC, (tasks, tasks))

    def start_network(self) -> None:
        network = self.plan["network"]
        if not network or self.init_pid is None:
            return
        self._wait_for_loopback()
        ready_r, ready_w = os.pipe()
        exit_r, self._slirp_exit_w = os.pipe()
        publish = network.get("publish")  # a service replica: its port on the host
        self.slirp = subprocess.Popen(  # noqa: S603  (fixed argv)
            [
                network["slirp4netns"],
                "--configure",
                "--mtu=65520",
                "--disable-host-loopback",
                "--enable-sandbox",
                "--enable-seccomp",
                *([f"--api-socket={publish['api_socket']}"] if publish else []),
                f"--ready-fd={ready_w}",
                f"--exit-fd={exit_r}",
                "--netns-type=path",
                f"/proc/{self.init_pid}/ns/net",
                "tap0",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(ready_w, exit_r),
            start_new_session=True,
        )
        os.close(ready_w)
        os.close(exit_r)
        ready, _, _ = select.select([ready_r], [], [], 30)
        if not ready or os.read(ready_r, 1) != b"1":
            os.close(ready_r)
            raise SandboxError("its network (slirp4netns) did not start")
        os.close(ready_r)
        if publish:
            _publish_port(publish)
        enter = [network["nsenter"], "-t", str(self.init_pid), "-n"]
        for cidr in network["deny"]:
            route = subprocess.run(  # noqa: S603  (fixed argv; the CIDR was validated)
                [*enter, network["ip"], "route", "add", "prohibit", cidr],
                capture_output=True,
                timeout=30,
            )
            if route.returncode != 0:
                raise SandboxError(f"could not refuse {cidr} to it: {route.stderr.decode()[:200]}")

    def _wait_for_loopback(self, timeout: float = 20.0) -> None:
        """bwrap sets up the sandbox's loopback after it reported the sandbox's pid; the
        two configuring one network namespace at once fail (RTM_NEWADDR), so slirp4netns
        starts once 127.0.0.1 is there."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{self.init_pid}/net/fib_trie") as table:
                    if "127.0.0.1" in table.read():
                        return
            except OSError:
                raise SandboxError("it ended while its network was being set up") from None
            time.sleep(0.005)
        raise SandboxError("its loopback did not come up")

    def release(self) -> None:
        """Let the job's command start."""
        os.write(self._block_w, b"1")
        os.close(self._block_w)

    def members(self) -> list[int]:
        """Host pids of the sandbox's processes, its PID 1 excepted."""
        if self.init_pid is None:
            return []
        try:
            namespace = os.readlink(f"/proc/{self.init_pid}/ns/pid")
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.init_pid:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/pid") == namespace:
                    found.append(int(entry))
        return found

    def signal(self, signum: int) -> None:
        """Send `signum` (and SIGCONT: a stopped process acts on SIGTERM only once
        continued) to every process of the job."""
        for pid in self.members():
            for each in (signum, signal.SIGCONT):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, each)

    def kill(self) -> None:
        """End the sandbox now: its PID 1 dies, and the kernel kills the rest."""
        if self.init_pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.init_pid, signal.SIGKILL)

    def close(self) -> None:
        if self._slirp_exit_w is not None:
            os.close(self._slirp_exit_w)  # slirp4netns exits when this closes
            self._slirp_exit_w = None
        if self.slirp is not None:
            try:
                self.slirp.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.slirp.kill()
                self.slirp.wait()

    # --- limits ---
    def usage(self) -> tuple[int, int]:
        """Resident memory (bytes) and tasks (threads) of the job's processes."""
        page = os.sysconf("SC_PAGE_SIZE")
        memory = tasks = 0
        for pid in self.members():
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
                tasks += int(fields[17])  # num_threads (field 20 of stat)
                memory += int(fields[21]) * page  # rss (field 24)
        return memory, tasks


class SandboxError(Exception):
    """The sandbox could not be set up; the job does not run."""


def _publish_port(publish: dict) -> None:
    """Forward `host_port` on the host's loopback to `guest_port` in the sandbox (slirp4netns'
    API): the one way in to a service replica or a job's declared ports (`ports`: several),
    whose network namespace is its own."""
    for each in publish.get("ports") or [publish]:
        _forward(publish["api_socket"], each)


def _forward(api_socket: str, publish: dict) -> None:
    request = {
        "execute": "add_hostfwd",
        "arguments": {
            "proto": "tcp",
            "host_addr": "127.0.0.1",
            "host_port": int(publish["host_port"]),
            "guest_port": int(publish["guest_port"]),
        },
    }
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as api:
        api.settimeout(10)
        api.connect(api_socket)
        api.sendall(json.dumps(request).encode())
        api.shutdown(socket.SHUT_WR)
        answer = json.loads(api.recv(4096) or b"{}")
    if "return" not in answer:
        raise SandboxError(f"its port could not be published: {answer.get('error', answer)}")


def _memfd(data: bytes) -> int:
    fd = os.memfd_create("gpugeek-sandbox", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _read_info(fd: int) -> int | None:
    """bwrap's `--info-fd` JSON: the sandbox's PID 1 as a host pid (None: bwrap failed)."""
    data = b""
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
        with contextlib.suppress(ValueError):
            return int(json.loads(data)["child-pid"])


def _directory_bytes(path: str, stop_at: int) -> int:
    """Disk blocks used under `path` (no links followed), counting up to `stop_at`."""
    total = 0
    pending = [path]
    while pending and total <= stop_at:
        with contextlib.suppress(OSError), os.scandir(pending.pop()) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    return total


def _watch_limits(sandbox: Sandbox, workdir: str, run_dir: Path, done: threading.Event) -> None:
    """Stop the job, saying why, once it holds more memory or tasks than it may, or its
    work dir grows past its cap. The reason goes where the console reads it (the run
    directory), never where the job could write."""
    limits = sandbox.limits
    gib = 1 << 30
    rounds = 0
    while not done.wait(LIMIT_POLL_SECONDS):
        memory, tasks = sandbox.usage()
        reason = ""
        if memory > limits["memory_bytes"]:
            reason = f"its memory passed its limit of {limits['memory_bytes'] / gib:.2f} GiB"
        elif tasks >= limits["processes"]:
            reason = f"it reached its limit of {limits['processes']:,} processes and threads"
        elif rounds % DISK_POLL_ROUNDS == 0:
            used = _directory_bytes(workdir, limits["disk_bytes"])
            if used > limits["disk_bytes"]:
                reason = (
                    f"its work dir passed its disk limit of {limits['disk_bytes'] / gib:.2f} GiB"
                )
        rounds += 1
        if reason:
            _write_atomic(run_dir / "limit", f"stopped: {reason}")
            sandbox.kill()
            return


def supervise(run_dir: Path, workdir: str, user: str | None, spec: dict) -> None:
    """The detached supervisor's whole life; it ends with os._exit."""
    os.umask(0o077)
    lock = os.open(run_dir / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    if any((run_dir / name).exists() for name in ("child.pid", "exit_code", "not_started")):
        os._exit(0)  # another supervisor of this run got here first: one run only
    log = open(run_dir / "output.log", "ab", buffering=0)  # noqa: SIM115
    intent = (run_dir / "intent").read_text().strip() if (run_dir / "intent").exists() else ""
    if intent in STOP_INTENTS:
        log.write(f"gpugeek: not started: the job was {STOP_INTENTS[intent]} first\n".encode())
        _write_atomic(run_dir / "not_started", intent)
        os._exit(0)
    _write_atomic(run_dir / "supervisor.pid", str(os.getpid()))
    read_fd, write_fd = os.pipe()
    sandbox: Sandbox | None = None
    child: subprocess.Popen | None = None
    pending: list[int] = []  # signals the console sent before the job was up

    def forward(signum, frame):  # a signal to the supervisor goes to the job too
        if child is None:
            pending.append(signum)
        elif sandbox is not None:
            sandbox.signal(signum)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        if spec.get("sandbox"):
            sandbox = Sandbox(spec["sandbox"], spec["command"], write_fd)
            if sandbox.init_pid is None:
                raise SandboxError("bubblewrap could not create it")
            sandbox.start_network()
            _write_atomic(run_dir / "sandbox.pid", str(sandbox.init_pid))
            sandbox.release()
            child = sandbox.process
        else:
            child = subprocess.Popen(  # noqa: S603  (argv from a validated spec; no shell)
                spec["command"],
                cwd=workdir,
                env=spec["env"],
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                start_new_session=True,
                umask=0o077,
                **_credentials(user),
            )
    except (OSError, KeyError, subprocess.SubprocessError, SandboxError) as error:
        if sandbox is not None:
            sandbox.kill()
            sandbox.process.wait()
            sandbox.close()
            os.close(write_fd)
            _copy_output(read_fd, log, int(spec.get("log_max_bytes") or 2**40))  # bwrap's words
        what = "the sandbox" if spec.get("sandbox") else repr(spec["command"][0])
        log.write(f"gpugeek: could not start {what}: {error}\n".encode())
        _write_atomic(run_dir / "exit_code", "127")
        os._exit(0)
    os.close(write_fd)
    _write_atomic(run_dir / "child.pid", str(child.pid))
    fcntl.flock(lock, fcntl.LOCK_UN)
    for signum in pending:
        forward(signum, None)
    max_bytes = int(spec.get("log_max_bytes") or 2**40)
    copier = threading.Thread(target=_copy_output, args=(read_fd, log, max_bytes), daemon=True)
    copier.start()
    done = threading.Event()
    if sandbox is not None:
        watcher = threading.Thread(
            target=_watch_limits, args=(sandbox, workdir, run_dir, done), daemon=True
        )
        watcher.start()
    code = child.wait()
    done.set()
    # What the job left running ends with it (as a pod's containers do); that also closes
    # the pipe's last writers.
    if sandbox is not None:
        sandbox.kill()
        sandbox.close()
        # One file may not grow past the cap (RLIMIT_FSIZE at cap + 1 byte): its write
        # failed, the job ended on it, and the work dir now holds more than the cap.
        disk = sandbox.limits["disk_bytes"]
        if not (run_dir / "limit").exists() and _directory_bytes(workdir, disk) > disk:
            _write_atomic(
                run_dir / "limit",
                f"stopped: its work dir passed its disk limit of {disk / (1 << 30):.2f} GiB",
            )
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    copier.join(timeout=5)
    # exit_code is written after the job's last output: readers rely on that order.
    _write_atomic(run_dir / "exit_code", str(code))
    os._exit(0)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 4) or (len(argv) == 4 and argv[2] != "--user"):
        print("usage: local_supervisor RUN_DIR WORKDIR [--user NAME] < spec.json", file=sys.stderr)
        return 2
    run_dir, workdir = Path(argv[0]), argv[1]
    user = argv[3] if len(argv) == 4 else None
    spec = json.loads(sys.stdin.buffer.read())
    # Detach: the first process exits at once (its starter reaps it, no zombie), the
    # second lives on, owned by init, in a session of its own.
    if os.fork() > 0:
        return 0
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    supervise(run_dir, workdir, user, spec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
