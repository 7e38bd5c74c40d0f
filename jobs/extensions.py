"""Extension points for the rooms above jobs (billing, and later services or
reservations). Jobs never imports them: they register here from `AppConfig.ready()`.

- Launch policies judge a launch before it is recorded (a budget that is used up).
- The job-cost provider prices jobs for their pages and the job API.
- `job_deleting` tells listeners a finished job is about to be deleted, inside the
  deleting transaction (billing moves the usage its meter holds into rollups).
- Fleet panels: extra sections on the staff fleet page (billing's revenue this month).
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

from django.dispatch import Signal

from marketplace.extensions import Panel, PanelProvider

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from console.models import Tenant
    from jobs.models import Job
    from jobs.services.spec import JobSpec

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

    def costs_to_date(self, jobs: list[Job]) -> dict[int, Decimal]:
        """Each job's cost so far (by id), in a constant number of queries."""
        ...

    def row_costs(self, rows: list[dict]) -> dict[int, Decimal]:
        """`costs_to_date` of a list page's `values()` rows (read `with_cost_inputs`)."""
        ...

    def run_rate(self, job: Job) -> Decimal | None:
        """The job's price per hour while it runs, or None without a price."""
        ...


class _NoCosts:
    """Before anything registers (or in an installation without billing): nothing is
    priced, and every job costs zero."""

    cost_columns: tuple[str, ...] = ("id",)

    def with_cost_inputs(self, jobs: QuerySet[Job]) -> QuerySet[Job]:
        return jobs

    def costs_to_date(self, jobs: list[Job]) -> dict[int, Decimal]:
        return {job.pk: Decimal(0) for job in jobs}

    def row_costs(self, rows: list[dict]) -> dict[int, Decimal]:
        return {row["id"]: Decimal(0) for row in rows}

    def run_rate(self, job: Job) -> Decimal | None:
        return None


_launch_policies: list[LaunchPolicy] = []
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
