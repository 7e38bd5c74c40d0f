"""Launches admitted at once are dispatched in batches, not a task each.

A task per launch dispatched 75–86 jobs/s per worker process, fewer than the API
accepts; a batch (`jobs_dispatch`: one read, concurrent creates, one transaction) does
several hundred. After its commit, a launch appends its job's id to a list in Redis and,
unless one is already waiting, queues a sweep (`jobs.tasks.jobs_dispatch_launched_task`)
that dispatches the list in batches of DISPATCH_BATCH_SIZE until it is empty.

Nothing is lost when a worker dies mid-sweep: a sweep moves each batch to a list of its
own task id before dispatching it (atomically, in one script), so Redis's redelivery of
the same task dispatches it again (safe to run twice); and the reconciler redispatches
any job left in `dispatching`, as for a lost task. Launches on a backend that hands out
devices (the local host) keep a task each: their dispatches run one at a time anyway.
"""

from __future__ import annotations

import contextlib
import logging

from django.conf import settings
from django.db import transaction

from console import queueing
from jobs.backends import get_backend
from jobs.models import Job
from jobs.services.dispatch import jobs_dispatch

log = logging.getLogger(__name__)

SWEEP_TASK = "jobs.tasks.jobs_dispatch_launched_task"
ONE_TASK = "jobs.tasks.job_dispatch_task"
# A sweep queued but not started keeps later launches from queueing another, for at
# most this long: if its worker died with it, the launches after that queue another
# (a sweep queued twice finds less to do, never does anything twice).
SWEEP_QUEUED_SECONDS = 5
# A dying sweep's claimed batch waits this long for the redelivery of its task (the
# reconciler has redone it long before).
CLAIM_KEPT_SECONDS = 24 * 3600
# Moves up to ARGV[1] ids from the pending list (KEYS[1]) to a sweep's claim (KEYS[2]).
CLAIM_SCRIPT = """
local ids = redis.call('lrange', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #ids > 0 then
  redis.call('ltrim', KEYS[1], #ids, -1)
  redis.call('rpush', KEYS[2], unpack(ids))
  redis.call('expire', KEYS[2], tonumber(ARGV[2]))
end
return ids
"""
# Every key of these hand-offs starts with this (after the console's prefix).
KEY_ROOT = "dispatch"


def _key(name: str) -> str:
    return f"{queueing.redis_prefix()}:{KEY_ROOT}:{name}"


def pending_key() -> str:
    return _key("launched")


def queued_key() -> str:
    return _key("sweep-queued")


def _claim_key(sweep_id: str) -> str:
    return _key(f"claimed:{sweep_id}")


def dispatch_launched_on_commit(job: Job) -> None:
    """Dispatch the job its launch has just admitted, once the launch commits."""
    if get_backend(job.backend).assigns_devices:
        queueing.enqueue_on_commit(ONE_TASK, job.pk)
    else:
        transaction.on_commit(lambda: list_for_sweep(job.pk))


def list_for_sweep(job_id: int) -> None:
    """What a committed launch does: list its job, and queue a sweep unless one waits."""
    import redis

    try:
        client = queueing.broker_redis()
        with client.pipeline() as both:  # MULTI: the id is listed before a sweep is due
            both.rpush(pending_key(), job_id)
            both.set(queued_key(), 1, nx=True, ex=SWEEP_QUEUED_SECONDS)
            _, sweep_due = both.execute()
    except redis.RedisError:
        log.exception("could not list job %s for a dispatch sweep; a task of its own", job_id)
        queueing.enqueue_now(ONE_TASK, job_id)  # (the broker is this Redis: the reconciler, likely)
        return
    if sweep_due and not queueing.enqueue_now(SWEEP_TASK):
        with contextlib.suppress(redis.RedisError):  # the next launch queues it again
            client.delete(queued_key())


def dispatch_launched(*, sweep_id: str) -> int:
    """The sweep: dispatch every listed launch, batch by batch; first, a batch an
    earlier delivery of this same task claimed and may not have finished. Returns how
    many jobs it handed to `jobs_dispatch` (some may have been dispatched already)."""
    client = queueing.broker_redis()
    client.delete(queued_key())  # launches from now on queue the next sweep
    claim_key = _claim_key(sweep_id)
    claim = client.register_script(CLAIM_SCRIPT)
    batch = client.lrange(claim_key, 0, -1)
    handled = 0
    while True:
        if not batch:
            keys = [pending_key(), claim_key]
            batch = claim(keys=keys, args=[settings.DISPATCH_BATCH_SIZE, CLAIM_KEPT_SECONDS])
        if not batch:
            return handled
        job_ids = sorted({int(job_id) for job_id in batch})
        jobs_dispatch(job_ids=job_ids)
        client.delete(claim_key)
        handled += len(job_ids)
        batch = []
