"""Running jobs on the console's own machine ("This host"): how far it is a boundary.

Staff grant host access per organisation (`Tenant.may_run_on_host`). Whether host jobs
are kept from the console and from each other is for the backends to say (a bubblewrap
sandbox on the local backend); the console never imports them: jobs registers a provider
here from `AppConfig.ready()`. Without isolation the host serves one trusted organisation
only: `host_access_check` refuses a second one, and the staff pages, `/healthz` and the
launcher say why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction
from django.http import HttpRequest

from console.models import Tenant, User
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record


@dataclass(frozen=True)
class HostIsolation:
    """`isolated`: one organisation's host jobs can't reach the console or another's.
    `note` says how, or what is missing (for staff)."""

    isolated: bool
    note: str = ""


HostIsolationProvider = Callable[[], HostIsolation | None]
_providers: dict[str, HostIsolationProvider] = {}


def host_isolation_register(name: str, provider: HostIsolationProvider) -> None:
    """Add (or replace, by name) what a room says of its host jobs (None: it runs none)."""
    _providers[name] = provider


def host_isolation() -> HostIsolation | None:
    """How isolated host jobs are; None when nothing runs jobs on this host."""
    answers = [answer for provider in _providers.values() if (answer := provider()) is not None]
    if not answers:
        return None
    return HostIsolation(
        isolated=all(answer.isolated for answer in answers),
        note=" ".join(answer.note for answer in answers if answer.note),
    )


def host_access_check(*, tenant: Tenant) -> None:
    """Refuse host access to `tenant` when host jobs aren't isolated and another
    organisation has it already: the host is then one trusted team's machine."""
    isolation = host_isolation()
    if isolation is None or isolation.isolated:
        return
    others = list(
        Tenant.objects.filter(may_run_on_host=True)
        .exclude(pk=tenant.pk)
        .values_list("name", flat=True)[:3]
    )
    if others:
        raise ServiceError(
            f"Only one organisation may run jobs on this host, and {', '.join(others)} "
            f"already does. {isolation.note}",
            code=ErrorCode.CONFLICT,
        )


@transaction.atomic
def tenant_set_may_run_on_host(
    *, tenant: Tenant, allowed: bool, user: User, request: HttpRequest | None = None
) -> Tenant:
    """Staff allow (or stop) an organisation running jobs on the console's own machine.
    Audited on the platform and the tenant's log; setting the value it has already
    changes nothing; a grant the host can't isolate is refused (`host_access_check`)."""
    if not user.is_staff:
        raise ServiceError("Only platform staff can change this.", code=ErrorCode.FORBIDDEN)
    tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
    if tenant.may_run_on_host != allowed:
        if allowed:
            host_access_check(tenant=tenant)
        tenant.may_run_on_host = allowed
        tenant.save(update_fields=["may_run_on_host"])
        audit_record(
            action="tenant.host_allowed" if allowed else "tenant.host_revoked",
            tenant=tenant,
            actor=user,
            target=tenant,
            request=request,
            metadata={"may_run_on_host": allowed},
        )
    return tenant
