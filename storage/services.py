"""Volume writes: create, resize (up only), delete. Each runs in one durable transaction
and records an audit event; backends forget a deleted volume's storage after commit."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.http import HttpRequest
from django.utils import timezone

from console.models import Tenant, User
from console.queueing import enqueue_now, enqueue_on_commit
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from jobs.backends import (
    BackendRejected,
    BackendUnavailable,
    ComputeBackend,
    configured_backends,
)
from jobs.extensions import VolumeMount
from jobs.services.secrets import tenant_secrets_resolve
from marketplace.models import Region, TenantQuota
from marketplace.selectors import regions_for_tenant
from storage import tasks
from storage.fill_copy import FillCancelled, copy_into
from storage.fill_sources import FillError, check_reachable, open_source, parse_source
from storage.models import FILL_ACTIVE, FillStatus, Volume, VolumeAccess, VolumeFill, VolumeStatus
from storage.selectors import volume_backend, volume_holders, volume_storage_gib
from storage.signals import volume_deleting, volume_resizing

# A DNS label: it names the volume's PersistentVolumeClaim and folder.
VOLUME_NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_VOLUME_GIB = 64 * 1024

log = logging.getLogger(__name__)


def _check_size(size_gib: int) -> None:
    if isinstance(size_gib, bool) or not isinstance(size_gib, int) or size_gib < 1:
        raise ServiceError("A volume is at least 1 GiB.", field="size_gib")
    if size_gib > MAX_VOLUME_GIB:
        raise ServiceError(f"A volume is at most {MAX_VOLUME_GIB:,} GiB.", field="size_gib")


def _check_quota(*, tenant: Tenant, more_gib: int) -> None:
    """The staff-set storage quota (tenant-wide quota row) bounds all existing volumes."""
    quota = TenantQuota.objects.for_tenant(tenant).filter(gpu_type=None).first()
    if quota is None or quota.max_storage_gib is None:
        return
    used = volume_storage_gib(tenant=tenant)
    if used + more_gib > quota.max_storage_gib:
        raise ServiceError(
            f"Your organisation's storage quota is {quota.max_storage_gib:,} GiB; "
            f"{used:,} GiB are in use, so {more_gib:,} GiB more don't fit.",
            field="size_gib",
        )


def _region(*, tenant: Tenant, slug: str) -> Region:
    region = regions_for_tenant(tenant).filter(slug=slug).first()
    if region is None:
        raise ServiceError(f"Unknown region “{slug}”.", field="region")
    return region


def volume_create(
    *,
    tenant: Tenant,
    user: User | None,
    name: str,
    size_gib: int,
    region: str,
    access: str = VolumeAccess.SINGLE_WRITER,
    request: HttpRequest | None = None,
) -> Volume:
    """A new, empty volume. Its storage (folder, PVC) is made when a job first mounts it."""
    if not isinstance(name, str) or not VOLUME_NAME_RE.match(name):
        raise ServiceError(
            "A volume name is up to 63 lower-case letters, digits and -, starting and "
            "ending with a letter or digit.",
            field="name",
        )
    _check_size(size_gib)
    if access not in VolumeAccess.values:
        raise ServiceError("Access is single_writer or shared.", field="access")
    region_row = _region(tenant=tenant, slug=region)
    try:
        with transaction.atomic(durable=True):
            # The tenant row is the lock that serialises quota checks of one tenant.
            Tenant.objects.select_for_update().filter(pk=tenant.pk).first()
            if Volume.objects.for_tenant(tenant).filter(name=name, deleted_at=None).exists():
                raise ServiceError(
                    f"A volume named {name} exists already.", code=ErrorCode.CONFLICT, field="name"
                )
            _check_quota(tenant=tenant, more_gib=size_gib)
            volume = Volume.objects.create(
                tenant=tenant,
                name=name,
                size_gib=size_gib,
                region=region_row,
                access=access,
                created_by=user,
                created_at=timezone.now(),  # the meter starts here
            )
            audit_record(
                action="volume.created",
                tenant=tenant,
                actor=user,
                target=volume,
                request=request,
                metadata={"name": name, "size_gib": size_gib, "region": region},
            )
    except IntegrityError:  # a concurrent create of the same name won
        raise ServiceError(
            f"A volume named {name} exists already.", code=ErrorCode.CONFLICT, field="name"
        ) from None
    return volume


def volume_resize(
    *, volume: Volume, user: User | None, size_gib: int, request: HttpRequest | None = None
) -> Volume:
    """Grow a volume (never shrink: data may fill it)."""
    _check_size(size_gib)
    with transaction.atomic(durable=True):
        Tenant.objects.select_for_update().filter(pk=volume.tenant_id).first()
        volume = Volume.objects.select_for_update().get(pk=volume.pk, deleted_at=None)
        if size_gib < volume.size_gib:
            raise ServiceError(
                f"Volumes only grow: {volume.name} is {volume.size_gib} GiB.", field="size_gib"
            )
        _check_quota(tenant=volume.tenant, more_gib=size_gib - volume.size_gib)
        before = volume.size_gib
        volume_resizing.send(sender=Volume, volume=volume)
        volume.size_gib = size_gib
        volume.save(update_fields=["size_gib"])
        volume_id, tenant_id = volume.pk, volume.tenant_id
        transaction.on_commit(
            lambda: _grow_storage(tenant_id=tenant_id, volume_id=volume_id, size_gib=size_gib)
        )
        audit_record(
            action="volume.resized",
            tenant=volume.tenant,
            actor=user,
            target=volume,
            request=request,
            metadata={"name": volume.name, "from_gib": before, "to_gib": size_gib},
        )
    return volume


def volume_delete(*, volume: Volume, user: User | None, request: HttpRequest | None = None) -> None:
    """Delete a volume and its data; refused (409) while a job that isn't finished mounts
    it. The meter stops at `deleted_at`."""
    with transaction.atomic(durable=True):
        volume = Volume.objects.select_for_update().get(pk=volume.pk, deleted_at=None)
        holder = volume_holders(volume=volume).first()
        if holder is not None:
            raise ServiceError(
                f"Volume {volume.name} is mounted by job #{holder.pk} “{holder.name}” "
                f"({holder.get_status_display().lower()}); delete it once that job ends.",
                code=ErrorCode.CONFLICT,
            )
        volume_deleting.send(sender=Volume, volume=volume)
        volume.deleted_at = timezone.now()
        volume.status = VolumeStatus.DELETED
        volume.save(update_fields=["deleted_at", "status"])
        volume.fills.filter(status__in=FILL_ACTIVE).update(
            status=FillStatus.CANCELLED,
            error="The volume was deleted.",
            finished_at=volume.deleted_at,
        )
        audit_record(
            action="volume.deleted",
            tenant=volume.tenant,
            actor=user,
            target=volume,
            request=request,
            metadata={"name": volume.name, "size_gib": volume.size_gib},
        )
        tenant_id, volume_id = volume.tenant_id, volume.pk
        transaction.on_commit(lambda: _forget_storage(tenant_id=tenant_id, volume_id=volume_id))


def _grow_storage(*, tenant_id: int, volume_id: int, size_gib: int) -> None:
    """Grow the storage backends made already (a claim). A backend that is down now
    keeps the old size until the volume is resized again (logged)."""
    for backend in configured_backends():
        try:
            backend.volume_resize(tenant_id=tenant_id, volume_id=volume_id, size_gib=size_gib)
        except BackendUnavailable as error:
            log.warning("volume %s not grown on a backend: %s", volume_id, error)


def _forget_storage(*, tenant_id: int, volume_id: int) -> None:
    for backend in configured_backends():
        backend.volume_remove(tenant_id=tenant_id, volume_id=volume_id)


def _fill_credential(*, tenant: Tenant, user: User | None, secret: str) -> str:
    """The named organisation secret's value, if the user's jobs may use it (the same
    rule as a launch's secrets)."""
    if not secret:
        return ""
    try:
        values = tenant_secrets_resolve(tenant=tenant, user=user, project="", names=[secret])
    except ServiceError as error:
        raise ServiceError(error.message, field="secret") from None
    return values[secret]


def volume_fill_start(
    *,
    volume: Volume,
    user: User | None,
    source: str,
    secret: str = "",
    endpoint: str = "",
    request: HttpRequest | None = None,
) -> VolumeFill:
    """Queue a copy into the volume from an HTTP(S) URL or s3://bucket/prefix. One fill
    at a time per volume (409), and none while a job that isn't finished mounts it
    read-write (409 naming the job): both would write the same files."""
    try:
        parsed = parse_source(source, endpoint=endpoint)
        check_reachable(parsed)
    except FillError as error:
        raise ServiceError(str(error), field="source") from None
    _fill_credential(tenant=volume.tenant, user=user, secret=secret)  # refused now, not later
    with transaction.atomic(durable=True):
        volume = Volume.objects.select_for_update().get(pk=volume.pk, deleted_at=None)
        running = volume.fills.filter(status__in=FILL_ACTIVE).first()
        if running is not None:
            raise ServiceError(
                f"Volume {volume.name} is being filled already (from {running.source}); "
                "wait for that copy to end or cancel it.",
                code=ErrorCode.CONFLICT,
            )
        holder = volume_holders(volume=volume, writers_only=True).first()
        if holder is not None:
            raise ServiceError(
                f"Volume {volume.name} is mounted read-write by job #{holder.pk} "
                f"“{holder.name}” ({holder.get_status_display().lower()}); fill it once "
                "that job ends.",
                code=ErrorCode.CONFLICT,
            )
        fill = VolumeFill.objects.create(
            volume=volume,
            source=parsed.url,
            endpoint=parsed.endpoint,
            secret=secret,
            created_by=user,
        )
        audit_record(
            action="volume.fill_started",
            tenant=volume.tenant,
            actor=user,
            target=volume,
            request=request,
            metadata={"name": volume.name, "source": parsed.url, "secret": secret},
        )
        enqueue_on_commit(tasks.volume_fill_task, fill.pk, fill.attempt)
    return fill


def volume_fill_cancel(
    *, volume: Volume, user: User | None, request: HttpRequest | None = None
) -> VolumeFill:
    """Cancel the volume's active fill: the copy stops at its next progress report and
    discards what it copied. 409 when no fill is active."""
    with transaction.atomic(durable=True):
        fill = (
            VolumeFill.objects.select_for_update()
            .filter(volume=volume, status__in=FILL_ACTIVE)
            .first()
        )
        if fill is None:
            raise ServiceError(
                f"Volume {volume.name} is not being filled.", code=ErrorCode.CONFLICT
            )
        who = user.get_username() if user is not None else "the console"
        fill.status = FillStatus.CANCELLED
        fill.error = f"Cancelled by {who}; nothing was written to the volume."
        fill.finished_at = timezone.now()
        fill.save(update_fields=["status", "error", "finished_at"])
        audit_record(
            action="volume.fill_cancelled",
            tenant=volume.tenant,
            actor=user,
            target=volume,
            request=request,
            metadata={"name": volume.name, "source": fill.source},
        )
    return fill


def _fill_ended(fill: VolumeFill, status: str, error: str = "") -> None:
    """Record the end of this run of a fill, if it still owns the row (a cancelled fill
    keeps its own reason; a newer run records its own end)."""
    VolumeFill.objects.filter(pk=fill.pk, status=FillStatus.RUNNING, attempt=fill.attempt).update(
        status=status, error=error[:1000], finished_at=timezone.now()
    )


def _fill_backend(volume: Volume) -> ComputeBackend:
    backend = volume_backend(volume=volume)
    if backend is None:
        raise FillError(f"No compute backend serves region {volume.region.slug}.")
    return backend


# How often a worker looks at a copy running on a cluster (its Job and its pod's log).
CLUSTER_FILL_POLL_SECONDS = 2.0
# Looks in a row the cluster may fail to answer before the fill fails (about a minute).
CLUSTER_FILL_UNANSWERED = 30


def _report_number(report: dict, key: str) -> int | None:
    """A count from the copy's report, if it is one (the pod's own account)."""
    value = report.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _fill_on_cluster(
    *,
    fill: VolumeFill,
    backend: ComputeBackend,
    credential: str,
    progress: Callable[[int, int, int | None], bool],
) -> None:
    """Run the fill as a copy pod where the volume's claim lives, report its progress
    on the row, and remove its objects when it ends (kept only while it runs)."""
    volume = fill.volume
    run = {"tenant_id": volume.tenant_id, "fill_id": fill.pk, "attempt": fill.attempt}
    mount = VolumeMount(
        volume_id=volume.pk,
        name=volume.name,
        path="/volume",
        read_only=False,
        size_gib=volume.size_gib,
        shared=volume.shared,
    )
    try:
        # An earlier run's copy may still go (its worker died, not its pod): stop it
        # first, so two copies never write into the volume.
        for earlier in range(1, fill.attempt):
            backend.volume_fill_stop(tenant_id=volume.tenant_id, fill_id=fill.pk, attempt=earlier)
        started = backend.volume_fill_start(
            mount=mount,
            source=fill.source,
            endpoint=fill.endpoint,
            credential=credential,
            **run,
        )
    except (BackendUnavailable, BackendRejected) as error:
        raise FillError(f"The cluster did not take the copy: {error}") from None
    if not started:
        raise FillError(f"Volumes in {volume.region.slug} can't be filled by the console.")
    unanswered = 0
    try:
        while True:
            time.sleep(CLUSTER_FILL_POLL_SECONDS)
            try:
                state = backend.volume_fill_status(**run)
            except BackendUnavailable as error:
                unanswered += 1
                if unanswered >= CLUSTER_FILL_UNANSWERED:
                    raise FillError(f"The cluster stopped answering: {error}") from None
                if not VolumeFill.objects.filter(
                    pk=fill.pk, status=FillStatus.RUNNING, attempt=fill.attempt
                ).update(touched_at=timezone.now()):
                    raise FillCancelled from None
                continue
            unanswered = 0
            report = state.report
            done = _report_number(report, "bytes") or 0
            files = _report_number(report, "files") or 0
            if not progress(done, files, _report_number(report, "total")):
                raise FillCancelled
            if state.phase == "succeeded":
                return
            if state.phase in ("failed", "gone"):
                error = report.get("error")
                raise FillError(str(error)[:1000] if error else state.reason)
    finally:
        try:
            backend.volume_fill_stop(**run)
        except BackendUnavailable:
            log.warning("fill %s run %s: its copy Job was not removed", fill.pk, fill.attempt)


def _fill_claim(fill_id: int, expected_attempt: int) -> VolumeFill | None:
    """Start run `expected_attempt + 1` of an active fill; None when the message is stale
    (the fill ended, or another run started since it was queued: a redelivered or
    duplicate message must not restart a copy under way)."""
    with transaction.atomic():
        fill = (
            VolumeFill.objects.select_for_update(of=("self",))
            .select_related("volume__tenant", "volume__region", "created_by")
            .filter(pk=fill_id, status__in=FILL_ACTIVE, attempt=expected_attempt)
            .first()
        )
        if fill is None:
            return None
        fill.attempt += 1
        fill.status = FillStatus.RUNNING
        fill.started_at = fill.touched_at = timezone.now()
        fill.bytes_done = fill.files_done = 0
        fill.save(
            update_fields=[
                "attempt", "status", "started_at", "touched_at", "bytes_done", "files_done"
            ]
        )  # fmt: skip
    return fill


def volume_fill_run(*, fill_id: int, attempt: int) -> None:
    """Run a queued fill (the worker's task): copy, reporting progress on the row, and
    end it succeeded, failed (saying why) or cancelled. `attempt` is the run count the
    message was queued at; the sweep queues a new one for a run that stopped showing
    life (its worker died), and the older run, if it still goes, stops."""
    fill = _fill_claim(fill_id, attempt)
    if fill is None:
        return
    volume = fill.volume

    def progress(done: int, files: int, total: int | None) -> bool:
        return bool(
            VolumeFill.objects.filter(
                pk=fill.pk, status=FillStatus.RUNNING, attempt=fill.attempt
            ).update(
                bytes_done=done, files_done=files, bytes_total=total, touched_at=timezone.now()
            )
        )

    try:
        if volume.deleted_at is not None:
            raise FillError(f"Volume {volume.name} was deleted.")
        credential = _fill_credential(
            tenant=volume.tenant, user=fill.created_by, secret=fill.secret
        )
        backend = _fill_backend(volume)
        folder = backend.volume_fill_folder(tenant_id=volume.tenant_id, volume_id=volume.pk)
        if folder is None:  # the volume lives on a cluster: the copy runs there
            _fill_on_cluster(fill=fill, backend=backend, credential=credential, progress=progress)
        else:
            opened = open_source(
                parse_source(fill.source, endpoint=fill.endpoint), credential=credential
            )
            copy_into(
                folder=folder,
                fill_id=fill.pk,
                attempt=fill.attempt,
                size_gib=volume.size_gib,
                opened=opened,
                progress=progress,
            )
    except FillCancelled:
        return
    except (FillError, ServiceError) as error:
        _fill_ended(fill, FillStatus.FAILED, getattr(error, "message", None) or str(error))
        return
    except OSError as error:
        log.exception("volume fill %s failed", fill.pk)
        _fill_ended(fill, FillStatus.FAILED, f"Writing to the volume failed: {error.strerror}.")
        return
    except Exception:  # the row must never stay "copying" (it blocks the next fill)
        log.exception("volume fill %s failed", fill.pk)
        _fill_ended(fill, FillStatus.FAILED, "The copy failed unexpectedly; try again.")
        raise
    _fill_ended(fill, FillStatus.SUCCEEDED)


# A fill that showed no life for this long (no bytes copied, not taken from the queue)
# lost its worker or its message; the source's reads time out well before (30 s).
FILL_STALE_SECONDS = 600
# Runs a fill may start before it fails: a source that kills every worker fails once.
FILL_MAX_ATTEMPTS = 3


def volume_fills_sweep() -> dict[str, int]:
    """Queue a new run of each active fill that stopped showing life (its worker died, or
    the broker lost its message), or fail it after FILL_MAX_ATTEMPTS runs. Returns
    counts {"requeued", "failed"}."""
    now = timezone.now()
    stale = VolumeFill.objects.filter(
        status__in=FILL_ACTIVE, touched_at__lt=now - timedelta(seconds=FILL_STALE_SECONDS)
    )
    failed = stale.filter(attempt__gte=FILL_MAX_ATTEMPTS, status=FillStatus.RUNNING).update(
        status=FillStatus.FAILED,
        error=(
            f"The copy stopped {FILL_MAX_ATTEMPTS} times without finishing (its worker "
            "stopped or the source stalled); start the fill again."
        ),
        finished_at=now,
    )
    requeued = 0
    for fill_id, attempt in stale.filter(
        Q(status=FillStatus.QUEUED) | Q(attempt__lt=FILL_MAX_ATTEMPTS)
    ).values_list("pk", "attempt"):
        # Touched now, so that a fill waiting behind busy workers is queued once per
        # FILL_STALE_SECONDS, not on every sweep; the claim takes one of its messages.
        if VolumeFill.objects.filter(pk=fill_id, attempt=attempt, touched_at__lt=now).update(
            touched_at=now
        ):
            requeued += enqueue_now(tasks.volume_fill_task, fill_id, attempt)
    if failed or requeued:
        log.warning("volume fills sweep: %s requeued, %s failed", requeued, failed)
    return {"requeued": requeued, "failed": failed}
