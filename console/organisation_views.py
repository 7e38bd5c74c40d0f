"""The organisation settings page: every member sees what its jobs' self-repair does by
default; owners and admins change it (console.services.tenants)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from console.forms import OrganisationSettingsForm, add_service_error
from console.permissions import Capability, capability_required, has_capability
from console.service_errors import ServiceError
from console.services.tenants import SETTINGS_REFUSAL, tenant_self_repair_defaults_set


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def organisation_settings(request: HttpRequest) -> HttpResponse:
    tenant = request.tenant
    can_manage = has_capability(request.membership, Capability.MANAGE_ORGANISATION)
    if request.method == "POST" and not can_manage:
        raise PermissionDenied(SETTINGS_REFUSAL)
    current = {name: getattr(tenant, name) for name in OrganisationSettingsForm.base_fields}
    # Bound on every POST: unticked boxes send nothing, so a POST may carry no field.
    form = OrganisationSettingsForm(
        request.POST if request.method == "POST" else None, initial=current
    )
    if not can_manage:
        for field in form.fields.values():
            field.disabled = True
    if request.method == "POST" and form.is_valid():
        try:
            tenant_self_repair_defaults_set(
                tenant=tenant,
                by_membership=request.membership,
                request=request,
                **form.cleaned_data,
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(request, "Organisation settings saved.")
            return redirect("organisation_settings")
    return render(
        request, "console/organisation_settings.html", {"form": form, "can_manage": can_manage}
    )
