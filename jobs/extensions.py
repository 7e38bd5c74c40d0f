"""Extension points for the rooms above jobs (billing, and later services or
reservations). Jobs never imports them: they register here from `AppConfig.ready()`.

- Launch policies judge a launch before it is recorded (a budget that is used up).
- The job-cost provider prices jobs for their pages and the job API.
- The volume provider (storage) resolves the volumes a spec mounts, records them with
  the job and tells backends what to mount; without one, a spec naming volumes is refused.
- `job_deleting` tells listeners a finished job is about to be deleted, inside the
  deleting transaction (billing moves the usage its meter holds into rollups).
- Fleet panels: extra sections on the staff fleet page (billing's revenue this month).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

from django.dispatch import Signal

from console.service_errors import ServiceError
from marketplace.extensions import Panel, PanelProvider

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from console.models import Tenant
    from jobs.models import Job
    from jobs.services.spec import JobSpec
    from marketplace.models import Region

# Sent with `job_ids` (a list of ids) inside the transaction that deletes them.
job_deleting = Signal()


class LaunchPolicy(Protocol):
    def check_launch(self, *, tenant: Tenant, spec: JobSpec) -> None:
        """Raise a ServiceError (with its API code) when `tenant` may not launch
        `spec` now."""
        ...


class JobCostProvider(Protocol):
    # The job columns `row_costs` reads from a values() row.
    cost_columns: tuple[str, ...]

    def with_cost_inputs(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        """`jobs` reading what `costs_to_date` needs along with each row, so that a list
        page costs no extra query for its costs."""
        ...

    def costs_to_date(
        self, jobs: list[Job], *, rates: dict[int, Decimal | None] | None = None
    ) -> dict[int, Decimal]:
        """Each job's cost so far (by id), in a constant number of queries. `rates`: the
        jobs' `run_rates` when the caller has them (the price book isn't read again)."""
        ...

    def row_costs(self, rows: list[dict]) -> dict[int, Decimal]:
        """`costs_to_date` of a list page's `values()` rows (read `with_cost_inputs`)."""
        ...

    def run_rate(self, job: Job) -> Decimal | None:
        """The job's price per hour while it runs, or None without a price."""
        ...

    def run_rates(self, jobs: list[Job]) -> dict[int, Decimal | None]:
        """`run_rate` of many jobs (by id), in a constant number of queries."""
        ...


class _NoCosts:
    """Before anything registers (or in an installation without billing): nothing is
    priced, and every job costs zero."""

    cost_columns: tuple[str, ...] = ("id",)

    def with_cost_inputs(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        return jobs

    def costs_to_date(
        self, jobs: list[Job], *, rates: dict[int, Decimal | None] | None = None
    ) -> dict[int, Decimal]:
        return {job.pk: Decimal(0) for job in jobs}

    def row_costs(self, rows: list[dict]) -> dict[int, Decimal]:
        return {row["id"]: Decimal(0) for row in rows}

    def run_rate(self, job: Job) -> Decimal | None:
        return None

    def run_rates(self, jobs: list[Job]) -> dict[int, Decimal | None]:
        return {job.pk: None for job in jobs}


@dataclass(frozen=True)
class VolumeMount:
    """One volume as a job's backend mounts it (the volume's id names its storage: a
    folder on the host, a PersistentVolumeClaim)."""

    volume_id: int
    name: str
    path: str
    read_only: bool
    size_gib: int
    shared: bool  # many jobs may mount it (else one writer at a time)


class VolumeProvider(Protocol):
    def check_mounts(self, *, tenant: Tenant, region: Region, mounts: list[dict]) -> None:
        """Raise a ServiceError when a mount (already well-formed: name, path, read_only)
        names no volume of `tenant` in `region`, or one held as its access forbids."""
        ...

    def attach(self, *, job: Job, mounts: list[dict]) -> None:
        """Record the job's mounts, inside its launch transaction (checked again there,
        under lock, so two launches can't both take a single-writer volume)."""
        ...

    def mounts_for(self, job: Job) -> list[VolumeMount]:
        """What the job mounts, in the order it asked."""
        ...

    def mounts_for_jobs(self, jobs: list[Job]) -> dict[int, list[VolumeMount]]:
        """`mounts_for` of many jobs (by id) in one query: a dispatch batch's."""
        ...


class _NoVolumes:
    """Without storage installed no spec may name a volume."""

    def check_mounts(self, *, tenant: Tenant, region: Region, mounts: list[dict]) -> None:
        if mounts:
            raise ServiceError("This installation offers no volumes.", field="volumes")

    def attach(self, *, job: Job, mounts: list[dict]) -> None:
        return None

    def mounts_for(self, job: Job) -> list[VolumeMount]:
        return []

    def mounts_for_jobs(self, jobs: list[Job]) -> dict[int, list[VolumeMount]]:
        return {job.pk: [] for job in jobs}


_launch_policies: list[LaunchPolicy] = []
_volume_provider: list[VolumeProvider] = [_NoVolumes()]
_cost_provider: list[JobCostProvider] = [_NoCosts()]


def launch_policy_register(policy: LaunchPolicy) -> None:
    if policy not in _launch_policies:
        _launch_policies.append(policy)


def launch_check(*, tenant: Tenant, spec: JobSpec) -> None:
    """Ask every registered launch policy; the first refusal is raised."""
    for policy in _launch_policies:
        policy.check_launch(tenant=tenant, spec=spec)


def job_cost_provider_register(provider: JobCostProvider) -> None:
    _cost_provider[0] = provider


def job_costs() -> JobCostProvider:
    return _cost_provider[0]


_fleet_panels: dict[str, PanelProvider] = {}


def fleet_panel_register(name: str, provider: PanelProvider) -> None:
    """Add (or replace, by name: `ready()` may run more than once) a fleet page panel."""
    _fleet_panels[name] = provider


def fleet_panels() -> list[Panel]:
    panels = (provider() for provider in _fleet_panels.values())
    return [panel for panel in panels if panel is not None]


def volume_provider_register(provider: VolumeProvider) -> None:
    _volume_provider[0] = provider


def volume_provider() -> VolumeProvider:
    return _volume_provider[0]
