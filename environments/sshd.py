"""The sshd an environment's job runs: Debian's OpenSSH server, unprivileged, keys only;
and the job's bootstrap, which starts it (and Jupyter: environments.jupyter).

Everything here is decided by the console and handed to the job at its start: the
command (argv, never a string the console runs through a shell), the configuration and
the authorized keys as its arguments, the host key as a secret variable (encrypted at
rest like every job secret). The job writes them into its own private /tmp and starts
`sshd -D -e` as the sandbox's user. The console never reads anything back from the job:
who may log in is decided again at the SSH gateway on every connection, and the job's
sshd is reachable only through it (its port is published to the host's loopback, which
host jobs can't reach).
"""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from console.ssh_public_keys import fingerprint_sha256
from jobs.backends.base import PUBLISHED_MOUNT

# Where sshd listens inside the job's network namespace (an unprivileged port: the job
# has no capabilities). All addresses: the host's published port arrives on the
# sandbox's own network interface (slirp4netns), not on its 127.0.0.1.
SSHD_PORT = 2222
PORT_NAME = "ssh"
# The user the job runs as inside its sandbox (jobs.backends.local_sandbox.INNER_USER):
# an unprivileged sshd can only log that user in.
SSH_USER = "job"
# Where the home volume is mounted: the sandbox user's home and working directory.
HOME_PATH = "/workspace"
HOST_KEY_VARIABLE = "SSHD_HOST_KEY"
# The file the console publishes to a running environment (ComputeBackend.publish_file)
# with the keys of everyone who may use it now: sshd reads it beside the keys of the start.
PUBLISHED_KEYS = "authorized_keys"

SSHD_CONFIG = """\
# Written by GpuGeek: sshd as the job's own user, public keys only.
ListenAddress 0.0.0.0:{port}
PubkeyAuthentication yes
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin no
# No PAM and no strict modes: sshd isn't root, and the home volume belongs to the
# organisation's group rather than to the user.
UsePAM no
StrictModes no
PidFile none
PrintMotd no
X11Forwarding no
# An external sftp-server: every session, sftp's too, goes through the session script.
Subsystem sftp /usr/lib/openssh/sftp-server
"""

# A session's command: sshd starts sessions with a clean environment, so each one
# first takes the job's variables (its env, secrets and GPU assignment), saved at start
# by `export -p` (quoted for sh), then runs what the client asked, or a login shell.
SESSION = """\
#!/bin/sh
. "$(dirname "$0")/environment"
cd "$HOME" 2>/dev/null || true
if [ -n "${SSH_ORIGINAL_COMMAND:-}" ]; then exec "${SHELL:-/bin/sh}" -c "$SSH_ORIGINAL_COMMAND"; fi
exec "${SHELL:-/bin/sh}" -l
"""

# $1: authorized keys (at start), $2: configuration, $3: the session script, $4: "ssh" to
# run sshd, $5: the keys file the console rewrites while the job runs (a key added later);
# jupyter-server's arguments follow when the environment has Jupyter (environments.jupyter).
# The host key comes in $SSHD_HOST_KEY and Jupyter's token in $ENVIRONMENT_JUPYTER_TOKEN: both
# are taken out of the environment before the job's variables are saved for the sessions
# (they never see them); the token goes to jupyter-server alone. Everything goes in the
# job's private /tmp (0700), never on the home volume.
BOOTSTRAP = """\
set -eu
umask 077
dir="${TMPDIR:-/tmp}/gpugeek-ssh"
rm -rf "$dir"
mkdir -p "$dir/jupyter"
host_key="${SSHD_HOST_KEY:-}"
jupyter_token="${ENVIRONMENT_JUPYTER_TOKEN:-}"
unset SSHD_HOST_KEY ENVIRONMENT_JUPYTER_TOKEN
(unset PWD OLDPWD SHLVL; export -p) > "$dir/environment"
keys=$1 config=$2 session=$3 ssh=$4 published_keys=$5
shift 5
if [ "$#" -gt 0 ]; then
  if [ -z "$ssh" ]; then
    JUPYTER_TOKEN="$jupyter_token" JUPYTER_RUNTIME_DIR="$dir/jupyter" \\
      exec /usr/bin/python3 -m jupyter_server "$@"
  fi
  JUPYTER_TOKEN="$jupyter_token" JUPYTER_RUNTIME_DIR="$dir/jupyter" \\
    /usr/bin/python3 -m jupyter_server "$@" &
fi
printf '%s\\n' "$host_key" > "$dir/host_key"
printf '%s' "$session" > "$dir/session"
chmod 700 "$dir/session"
printf '%s' "$keys" > "$dir/authorized_keys"
{ printf '%s' "$config"; printf 'HostKey %s/host_key\\n' "$dir"
  printf 'AuthorizedKeysFile %s/authorized_keys %s\\n' "$dir" "$published_keys"
  printf 'ForceCommand %s/session\\n' "$dir"; } > "$dir/sshd_config"
exec /usr/sbin/sshd -D -e -f "$dir/sshd_config"
"""


def environment_command(
    *, authorized_keys: str, ssh: bool = True, jupyter_arguments: list[str] | None = None
) -> list[str]:
    """The job's argv: a POSIX shell that writes the files and runs sshd, Jupyter or
    both (Jupyter in the background, sshd in front)."""
    return [
        "/bin/sh",
        "-c",
        BOOTSTRAP,
        "gpugeek-environment",
        authorized_keys,
        SSHD_CONFIG.format(port=SSHD_PORT),
        SESSION,
        "ssh" if ssh else "",
        f"{PUBLISHED_MOUNT}/{PUBLISHED_KEYS}",
        *(jupyter_arguments or []),
    ]


def host_key_generate() -> tuple[str, str]:
    """A new Ed25519 host key: (private key in OpenSSH's format, public key line)."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return private, public


def public_key_fingerprint(public_line: str) -> str:
    """SHA256:… of an OpenSSH public key line, as ssh-keygen -l shows it."""
    return fingerprint_sha256(base64.b64decode(public_line.split()[1]))
