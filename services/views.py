"""Service pages: the list with its create form, and a service's page (status, endpoint
with a curl example, autoscaling with its latest decisions, replicas, revisions with
rollback, tokens), and a replica's log. Thin over services."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console.confirm import confirm_then_act
from console.forms import add_service_error
from console.permissions import Capability, capability_required, has_capability
from console.service_errors import ServiceError
from console.tenancy import get_for_tenant_or_404
from services import selectors, services
from services.forms import ServiceForm, ServiceTokenForm
from services.logs import LogsUnavailable, replica_log_lines
from services.models import Service, ServiceAuth

LOG_PAGE_LINES = 500


def _may_deploy(request: HttpRequest) -> bool:
    return has_capability(request.membership, Capability.LAUNCH_JOBS)


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def service_list(request: HttpRequest) -> HttpResponse:
    form = ServiceForm(request.POST or None) if _may_deploy(request) else None
    if request.method == "POST":
        if form is None:
            return HttpResponse(status=403)
        if form.is_valid():
            try:
                service = services.service_create(
                    tenant=request.tenant, user=request.user, spec=form.to_spec(), request=request
                )
            except ServiceError as error:
                add_service_error(form, error)
            else:
                messages.success(request, f"Service “{service.name}” is deploying.")
                return redirect("services:detail", service_id=service.pk)
    context = {"services": selectors.services_for_tenant(tenant=request.tenant), "form": form}
    return render(request, "services/list.html", context)


def _service(request: HttpRequest, service_id: int) -> Service:
    return get_for_tenant_or_404(
        selectors.services_for_tenant(tenant=request.tenant), request.tenant, pk=service_id
    )


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def service_detail(request: HttpRequest, service_id: int) -> HttpResponse:
    service = _service(request, service_id)
    may_deploy = _may_deploy(request)
    form = ServiceTokenForm(request.POST or None) if may_deploy else None
    new_token = None
    if request.method == "POST":
        if form is None:
            return HttpResponse(status=403)
        if form.is_valid():
            try:
                token, raw = services.service_token_create(
                    service=service, user=request.user, name=form.cleaned_data["name"],
                    request=request,
                )  # fmt: skip
            except ServiceError as error:
                add_service_error(form, error)
            else:
                new_token = {"name": token.name, "value": raw}
                form = ServiceTokenForm()
    endpoint = request.build_absolute_uri(selectors.endpoint_path(service))
    context = {
        "service": service,
        "endpoint": endpoint,
        "needs_token": service.auth == ServiceAuth.TOKEN,
        "replicas": selectors.service_replicas(service=service),
        "revisions": selectors.service_revisions(service=service),
        "scale_events": selectors.service_scale_events(service=service, limit=20),
        "tokens": selectors.service_tokens(service=service),
        "token_form": form,
        "new_token": new_token,
        "may_deploy": may_deploy,
    }
    return render(request, "services/detail.html", context)


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def service_rollback(request: HttpRequest, service_id: int, revision_number: int) -> HttpResponse:
    service = _service(request, service_id)
    detail_url = reverse("services:detail", args=[service.pk])
    return confirm_then_act(
        request,
        title="Roll back",
        message=f"Run revision {revision_number} of “{service.name}” again? Its replicas "
        "replace the current ones once they are ready.",
        confirm_label="Roll back",
        act=lambda: services.service_rollback(
            service=service, user=request.user, revision_number=revision_number, request=request
        ),
        success_url=detail_url,
        success_message=f"Rolling back to revision {revision_number}.",
        cancel_url=detail_url,
        danger=False,
    )


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def service_delete(request: HttpRequest, service_id: int) -> HttpResponse:
    service = _service(request, service_id)
    return confirm_then_act(
        request,
        title="Delete service",
        message=f"Delete “{service.name}”? Its replicas stop and its endpoint answers 404 at "
        "once. This can't be undone.",
        confirm_label="Delete",
        act=lambda: services.service_delete(service=service, user=request.user, request=request),
        success_url=reverse("services:list"),
        success_message=f"Service “{service.name}” deleted.",
        cancel_url=reverse("services:detail", args=[service.pk]),
    )


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def service_token_revoke(
    request: HttpRequest, service_id: int, service_token_id: int
) -> HttpResponse:
    service = _service(request, service_id)
    token = get_for_tenant_or_404(service.tokens.all(), request.tenant, pk=service_token_id)
    detail_url = reverse("services:detail", args=[service.pk])
    return confirm_then_act(
        request,
        title="Revoke service token",
        message=f"Revoke “{token.name}” ({token.prefix}…)? Callers using it get 401 at once.",
        confirm_label="Revoke",
        act=lambda: services.service_token_revoke(token=token, user=request.user, request=request),
        success_url=detail_url,
        success_message=f"Token “{token.name}” revoked.",
        cancel_url=detail_url,
    )


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET"])
def replica_logs(request: HttpRequest, service_id: int, replica_id: int) -> HttpResponse:
    """A replica's latest lines; the page polls its own log block while the replica runs."""
    service = _service(request, service_id)
    replica = get_object_or_404(selectors.service_replicas(service=service), pk=replica_id)
    error = ""
    try:
        lines = replica_log_lines(replica, tail=LOG_PAGE_LINES)
    except LogsUnavailable as unavailable:
        lines, error = [], f"The log can't be read now: {unavailable}"
    context = {"service": service, "replica": replica, "lines": lines, "error": error}
    if request.headers.get("HX-Request"):
        return render(request, "services/partials/replica_log.html", context)
    return render(request, "services/replica_logs.html", context)
