"""Volumes on the local backend: a folder per volume under LOCAL_VOLUME_DIR, bind-mounted
into the job's bubblewrap sandbox at the mount path (read-only where asked).

The folder belongs to the organisation's host gid (setgid, group rwx) with a default ACL
giving that group rw on everything created in it (jobs run with umask 077: without the
ACL a file would be its writer's alone), so each job of the organisation (its own uid)
reads and writes what an earlier one wrote. Size is enforced before each
start: a volume whose folder already holds its size (or more) refuses the start, saying
so; a job may overrun it while it runs (a filesystem quota per folder would be needed to
stop it mid-write), and the next start is refused until data is removed or it grows."""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from pathlib import Path

from django.conf import settings

from jobs.backends import local_sandbox
from jobs.backends.base import BackendRejected
from jobs.extensions import VolumeMount, volume_provider
from jobs.models import Job

GIB = 1 << 30
# A minimal POSIX default ACL (the kernel's xattr layout, version 2): owner rwx, group
# rwx, others nothing; it takes the place of the umask for what is created below.
_UNDEFINED_ID = 0xFFFFFFFF
GROUP_SHARED_DEFAULT_ACL = struct.pack("<I", 2) + b"".join(
    struct.pack("<HHI", tag, permissions, _UNDEFINED_ID)
    for tag, permissions in ((0x01, 0o7), (0x04, 0o7), (0x20, 0))  # user_obj, group_obj, other
)


def volume_root() -> Path:
    return Path(settings.LOCAL_VOLUME_DIR)


def volume_folder(*, tenant_id: int, volume_id: int) -> Path:
    return volume_root() / f"t{int(tenant_id)}-v{int(volume_id)}"


def folder_bytes(folder: Path) -> int:
    """Disk the folder's files take (allocated blocks, links not followed)."""
    total = 0
    for directory, subdirectories, files in os.walk(folder):
        for name in [*subdirectories, *files]:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except OSError:
                continue  # removed meanwhile
    return total


def _make_folder(folder: Path, tenant_id: int, own_uid: bool) -> None:
    root = volume_root()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o711)  # noqa: S103  (jobs pass through to their volume, list nothing)
    if folder.is_dir():
        return
    folder.mkdir(mode=0o770)
    if own_uid:
        os.chown(folder, 0, local_sandbox.tenant_gid(tenant_id), follow_symlinks=False)
    # setgid: what jobs write stays the organisation's group (its jobs only).
    os.chmod(folder, 0o2770)  # noqa: S103
    # On a filesystem without ACLs files stay their writer's (documented).
    with contextlib.suppress(OSError):
        os.setxattr(folder, "system.posix_acl_default", GROUP_SHARED_DEFAULT_ACL)


def volume_binds(job: Job) -> list[tuple[Path, str, bool]]:
    """(folder, mount path, read-only) of each volume the job mounts, folders made and
    their sizes checked; BackendRejected when one can't be mounted."""
    return mount_binds(tenant_id=job.tenant_id, mounts=volume_provider().mounts_for(job))


def mount_binds(*, tenant_id: int, mounts: list[VolumeMount]) -> list[tuple[Path, str, bool]]:
    """`volume_binds` of any process of the organisation (a job, a service's replica)."""
    if not mounts:
        return []
    support = local_sandbox.sandbox_support()
    if not support.available:
        raise BackendRejected(
            f"volumes are mounted only inside the host sandbox, which is off here: {support.reason}"
        )
    binds = []
    for mount in mounts:
        folder = volume_folder(tenant_id=tenant_id, volume_id=mount.volume_id)
        _make_folder(folder, tenant_id, support.own_uid)
        if not mount.read_only:  # (a full volume can still be read)
            used = folder_bytes(folder)
            if used >= mount.size_gib * GIB:
                raise BackendRejected(
                    f"volume {mount.name} is full ({used / GIB:.2f} GiB used of "
                    f"{mount.size_gib} GiB): grow it or remove files before starting"
                )
        binds.append((folder, mount.path, mount.read_only))
    return binds


def volume_remove(*, tenant_id: int, volume_id: int) -> None:
    shutil.rmtree(volume_folder(tenant_id=tenant_id, volume_id=volume_id), ignore_errors=True)


def fill_folder(*, tenant_id: int, volume_id: int) -> Path:
    """The volume's folder, made as a job's start makes it (the organisation's group, its
    default ACL), for the console's worker to copy a fill into."""
    folder = volume_folder(tenant_id=tenant_id, volume_id=volume_id)
    support = local_sandbox.sandbox_support()
    _make_folder(folder, tenant_id, support.available and support.own_uid)
    return folder
