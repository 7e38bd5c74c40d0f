"""Catalog pages for every signed-in member (staff included): offers, the live estimate,
the image catalog, and a tenant's own private images and registry logins."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_http_methods

from console.confirm import confirm_then_act
from console.forms import add_service_error
from console.permissions import Capability, capability_required, has_capability
from console.service_errors import ServiceError
from console.tenancy import get_for_tenant_or_404
from marketplace import selectors, services
from marketplace.forms import (
    EstimateForm,
    ImageFilterForm,
    ImageForm,
    OfferFilterForm,
    RecommendForm,
    RegistryCredentialForm,
)
from marketplace.models import AllowedRegistry, Image, RegistryCredential
from marketplace.pricing import PricingError, estimate_cost
from marketplace.recommend import Precision, Recommendation, Workload, gpu_recommendations
from marketplace.views.common import image_create_from_form


@login_required
def offers(request: HttpRequest) -> HttpResponse:
    form = OfferFilterForm(request.GET or None)
    form.fields["region"].queryset = selectors.regions_for_tenant(request.tenant)
    filters = form.cleaned_data if form.is_valid() else {}
    table = selectors.offer_table(
        tenant=request.tenant,
        vendor=filters.get("vendor") or None,
        gpu_type=filters["gpu_type"].slug if filters.get("gpu_type") else None,
        min_memory_gib=filters.get("min_memory_gib"),
        region=filters["region"].slug if filters.get("region") else None,
        tier=filters.get("tier") or None,
        available_only=bool(filters.get("available")),
        sort=filters.get("sort") or "price",
        interconnect=filters.get("interconnect") or None,
        cpu_arch=filters.get("cpu_arch") or None,
    )
    context = {
        "form": form,
        "offer_table": table,
        "compact": bool(filters.get("compact")),
        "estimate_form": _estimate_form(
            request,
            initial={
                "region": "us-west",
                "gpu_type": "a100-80gb",
                "spot_ratio": "0.7",
                "hours": 24,
            },
        ),
    }
    if request.htmx and request.htmx.target == "offers-table":
        return render(request, "marketplace/offers.html#offers-table", context)
    return render(request, "marketplace/offers.html", context)


def _estimate_form(request: HttpRequest, **kwargs) -> EstimateForm:
    """The estimate form, offering only the regions the tenant may use ("This host" is
    priced only for tenants staff allow to run on it)."""
    form = EstimateForm(**kwargs)
    form.fields["region"].queryset = selectors.regions_for_tenant(request.tenant)
    return form


@login_required
def estimate(request: HttpRequest) -> HttpResponse:
    """Live estimate partial (htmx, as the user types); also a full page without JS."""
    form = _estimate_form(request, data=request.GET or None)
    result = None
    if form.is_valid():
        data = form.cleaned_data
        try:
            result = estimate_cost(
                gpu_type=data["gpu_type"],
                region=data["region"],
                nodes=data["nodes"],
                gpus_per_node=data.get("gpus_per_node") or 0,
                cpus=data.get("cpus") or 0,
                spot_ratio=data["spot_ratio"],
                hours=data["hours"],
                tier=data["tier"],
                reserved_months=data.get("reserved_months") or 1,
                tenant=request.tenant,
            )
        except PricingError as error:
            add_service_error(form, error)
    template = "marketplace/partials/estimate.html" if request.htmx else "marketplace/estimate.html"
    context = {"estimate_form": form, "estimate": result}
    # "Launch this": the launch form with the estimate's choices (not on the launch
    # form's own estimate, which prices what that form holds).
    may_launch = has_capability(getattr(request, "membership", None), Capability.LAUNCH_JOBS)
    if result is not None and may_launch and not request.GET.get("in_launch_form"):
        context["launch_query"] = estimate_launch_query(form.cleaned_data)
    return render(request, template, context)


def estimate_launch_query(data: dict) -> str:
    """The launch link's query for an estimate's choices (jobs.forms.initial_from_link
    reads it): what the estimate priced, its hours as the maximum runtime."""
    gpu_type = data["gpu_type"]
    params = {
        "gpu_type": gpu_type.slug if gpu_type else "",
        "region": data["region"].slug,
        "nodes": data["nodes"],
        "spot_ratio": data["spot_ratio"],
        "hours": data["hours"],
    }
    if gpu_type and data.get("gpus_per_node"):
        params["gpus_per_node"] = data["gpus_per_node"]
    if not gpu_type and data.get("cpus"):
        params["cpus"] = data["cpus"]
    return urlencode(params)


@login_required
def recommend(request: HttpRequest) -> HttpResponse:
    """The GPU recommender's options table (htmx, from the launch form and the estimate
    page); a full page without JS."""
    form = RecommendForm(request.GET or None)
    recommendation: Recommendation | None = None
    if form.is_valid():
        data = form.cleaned_data
        try:
            recommendation = gpu_recommendations(
                tenant=request.tenant,
                parameters_billion=float(data["parameters_billion"]),
                workload=Workload(data["workload"]),
                precision=Precision(data["precision"]),
                sequence_length=data["sequence_length"],
                batch_size=data["batch_size"],
            )
        except ServiceError as error:
            add_service_error(form, error)
    context = {"recommend_form": form, "recommendation": recommendation}
    if request.htmx:
        return render(request, "marketplace/partials/recommend.html", context)
    return render(request, "marketplace/recommend.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def images(request: HttpRequest) -> HttpResponse:
    can_add = has_capability(request.membership, Capability.MANAGE_PRIVATE_IMAGES)
    posted = request.POST if request.method == "POST" else None
    which = request.POST.get("form") if posted else None
    image_form = ImageForm(posted if which != "registry-credential" else None, prefix="new")
    credential_form = RegistryCredentialForm(
        posted if which == "registry-credential" else None, prefix="login"
    )
    if request.method == "POST":
        if not can_add:
            raise Http404("Not found.")
        if which == "registry-credential":
            if _registry_credential_save(request, credential_form):
                return redirect(f"{reverse('marketplace:images')}#registry-logins")
        else:
            image = image_create_from_form(request, image_form, tenant=request.tenant)
            if image is not None:
                messages.success(request, f"Private image “{image.name}” added.")
                return redirect("marketplace:images")
    filters = ImageFilterForm(request.GET or None)
    data = filters.cleaned_data if filters.is_valid() else {}
    catalog = selectors.images_for_tenant(
        tenant=request.tenant,
        query=data.get("q", ""),
        kind=data.get("kind", ""),
        vendor=data.get("vendor", ""),
    )
    context = {
        "filters": filters,
        "images": Paginator(catalog, 50).get_page(request.GET.get("page")),
        "image_form": image_form,
        "credential_form": credential_form,
        "registry_credentials": selectors.registry_credentials_for_tenant(tenant=request.tenant),
        "can_add": can_add,
        "allowed_registries": AllowedRegistry.objects.all(),
    }
    if request.htmx and request.htmx.target == "image-list":
        return render(request, "marketplace/images.html#image-list", context)
    return render(request, "marketplace/images.html", context)


def _registry_credential_save(request: HttpRequest, form: RegistryCredentialForm) -> bool:
    if not form.is_valid():
        return False
    try:
        credential = services.registry_credential_set(
            tenant=request.tenant, user=request.user, request=request, **form.cleaned_data
        )
    except ServiceError as error:
        add_service_error(form, error)
        return False
    messages.success(
        request,
        f"Login for {credential.registry} saved; its password won't be shown again.",
    )
    return True


@capability_required(Capability.MANAGE_PRIVATE_IMAGES)
@require_http_methods(["GET", "POST"])
def registry_credential_delete(request: HttpRequest, credential_id: int) -> HttpResponse:
    credential = get_for_tenant_or_404(RegistryCredential, request.tenant, pk=credential_id)
    return confirm_then_act(
        request,
        title="Remove registry login",
        message=f"Remove the login for {credential.registry}? Jobs launched later from "
        "its private images can't pull them; running jobs are not affected.",
        confirm_label="Remove",
        act=lambda: services.registry_credential_delete(
            credential=credential, user=request.user, request=request
        ),
        success_url=f"{reverse('marketplace:images')}#registry-logins",
        success_message=f"Login for {credential.registry} removed.",
        cancel_url=reverse("marketplace:images"),
    )


@capability_required(Capability.MANAGE_PRIVATE_IMAGES)
@require_http_methods(["GET", "POST"])
def image_deactivate(request: HttpRequest, image_id: int) -> HttpResponse:
    image = get_for_tenant_or_404(
        Image.objects.owned_by(request.tenant), request.tenant, pk=image_id
    )
    return confirm_then_act(
        request,
        title="Retire private image",
        message=f"Stop offering “{image.name}” for new jobs? Running jobs are not affected.",
        confirm_label="Retire",
        act=lambda: services.image_deactivate(image=image, user=request.user, request=request),
        success_url=reverse("marketplace:images"),
        success_message=f"“{image.name}” is no longer offered for new jobs.",
        cancel_url=reverse("marketplace:images"),
    )
