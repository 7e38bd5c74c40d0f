"""The Environments pages: the list with the create form, an environment's page (status,
the ssh command and ~/.ssh/config entry, start/stop/delete)."""

from __future__ import annotations

from functools import partial

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from console.confirm import confirm_then_act
from console.forms import add_service_error
from console.permissions import Capability, capability_required, has_capability
from console.service_errors import ServiceError
from console.tenancy import get_for_tenant_or_404
from environments import jupyter, selectors, services
from environments.forms import EnvironmentCreateForm
from environments.models import Environment
from marketplace.models import GpuType
from marketplace.selectors import images_for_tenant
from storage.selectors import volumes_for_tenant

PAGE_SIZE = 25


def _environment(request: HttpRequest, name: str) -> Environment:
    environment = get_for_tenant_or_404(
        selectors.environments_for_tenant(tenant=request.tenant), request.tenant, name=name
    )
    return services.environment_sync(environment=environment)


def _create_form(request: HttpRequest) -> EnvironmentCreateForm:
    tenant = request.tenant
    return EnvironmentCreateForm(
        request.POST or None,
        regions=[
            (r.slug, r.name) for r in selectors.environment_regions(tenant=tenant).order_by("slug")
        ],
        # Images that serve SSH/Jupyter themselves first (this host provides both anyway).
        images=[
            (i.slug, f"{i.name} · {i.get_interactive_display()}" if i.interactive else i.name)
            for i in images_for_tenant(tenant=tenant).order_by("-interactive", "name")
        ],
        gpu_types=[(g.slug, g.model) for g in GpuType.objects.order_by("model")],
        volumes=[(v.name, v.name) for v in volumes_for_tenant(tenant=tenant)],
    )


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def environment_list(request: HttpRequest) -> HttpResponse:
    can_create = has_capability(request.membership, Capability.LAUNCH_JOBS)
    form = _create_form(request) if can_create else None
    if request.method == "POST":
        if form is None:
            raise Http404("Not found.")
        if form.is_valid():
            try:
                environment = services.environment_create(
                    tenant=request.tenant, user=request.user, request=request, **form.cleaned_data
                )
            except ServiceError as error:
                add_service_error(form, error)
            else:
                messages.success(request, f"Environment {environment.name} created; start it.")
                return redirect("environments:detail", name=environment.name)
    page = Paginator(selectors.environments_for_tenant(tenant=request.tenant), PAGE_SIZE)
    environments = page.get_page(request.GET.get("page"))
    for environment in environments:
        services.environment_sync(environment=environment)
    return render(request, "environments/list.html", {"environments": environments, "form": form})


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET"])
def environment_detail(request: HttpRequest, name: str) -> HttpResponse:
    environment = _environment(request, name)
    context = {
        "environment": environment,
        "may_use": selectors.may_use_environment(request.membership, environment),
        "deletion_at": selectors.environment_deletion_at(environment),
        "has_ssh": jupyter.has_ssh(environment),
        "jupyter_url": selectors.jupyter_url(environment),
        "may_open_jupyter": selectors.may_open_jupyter(request.user, environment),
    }
    if request.htmx and request.htmx.target == "environment-status":
        return render(request, "environments/detail.html#environment-status", context)
    context |= {
        "ssh_command": selectors.ssh_command(environment),
        "ssh_config": selectors.ssh_config_snippet(environment),
        "known_hosts": selectors.known_hosts_line(environment),
        "fingerprint": selectors.host_key_fingerprint(environment),
        "has_key": request.user.ssh_keys.exists(),
    }
    return render(request, "environments/detail.html", context)


def _act(request: HttpRequest, name: str, act, done: str) -> HttpResponse:
    """A button on the environment's page: the service's refusal or `done`, then back."""
    environment = _environment(request, name)
    try:
        act(environment=environment, user=request.user)
    except ServiceError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, done)
    return redirect("environments:detail", name=name)


@capability_required(Capability.LAUNCH_JOBS)
@require_POST
def environment_start(request: HttpRequest, name: str) -> HttpResponse:
    act = partial(services.environment_start, request=request)
    return _act(request, name, act, f"Environment {name} is starting.")


@capability_required(Capability.LAUNCH_JOBS)
@require_POST
def environment_stop(request: HttpRequest, name: str) -> HttpResponse:
    act = partial(services.environment_stop, request=request)
    return _act(request, name, act, f"Environment {name} is stopping; its home volume stays.")


@capability_required(Capability.LAUNCH_JOBS)
@require_POST
def environment_keep_alive(request: HttpRequest, name: str) -> HttpResponse:
    """The idle warning's "Keep running": activity now, so the stop is called off."""
    return _act(
        request, name, services.environment_keep_alive, f"Environment {name} keeps running."
    )


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def environment_delete(request: HttpRequest, name: str) -> HttpResponse:
    """Asks first; `?keep_volume=false` (offered on the page) deletes the home volume too."""
    environment = _environment(request, name)
    keep = request.GET.get("keep_volume", "true") != "false"
    volume = environment.home_volume.name
    here = reverse("environments:delete", kwargs={"name": name})
    return confirm_then_act(
        request,
        title="Delete environment",
        message=(
            f"Delete environment {name}? Its home volume {volume} is kept, with its files."
            if keep
            else f"Delete environment {name} and its home volume {volume} with every file "
            "on it? This can't be undone."
        ),
        confirm_label="Delete environment" if keep else "Delete environment and volume",
        act=lambda: services.environment_delete(
            environment=environment, user=request.user, keep_volume=keep, request=request
        ),
        success_url=reverse("environments:list"),
        success_message=f"Environment {name} deleted."
        + (f" Volume {volume} was kept." if keep else ""),
        cancel_url=reverse("environments:detail", kwargs={"name": name}),
        alternative=(
            ("Delete the home volume too", f"{here}?keep_volume=false")
            if keep
            else ("Keep the home volume", f"{here}?keep_volume=true")
        ),
    )
