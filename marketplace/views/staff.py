"""Staff pages for the catalog and its customers: GPU types, node pools, the registry
allow-list, public images, and each tenant's pricing and quotas (the price book has its
own module). Every change goes through a marketplace service, which audits it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from console.confirm import confirm_then_act
from console.forms import add_service_error
from console.models import Tenant
from console.permissions import staff_required
from console.service_errors import ServiceError
from console.tenant_admin import tenant_fair_share_set
from marketplace import selectors, services
from marketplace.forms import (
    AllowedRegistryForm,
    FairShareForm,
    GpuTypeForm,
    ImageForm,
    NewTenantPolicyForm,
    NodePoolForm,
    TenantPricingForm,
    TenantQuotaForm,
)
from marketplace.models import (
    AllowedRegistry,
    GpuType,
    Image,
    NodePool,
    TenantPricing,
    TenantQuota,
)
from marketplace.views.common import image_create_from_form


@staff_required
def staff_catalog(request: HttpRequest) -> HttpResponse:
    policy = selectors.new_tenant_policy()
    return render(
        request,
        "marketplace/staff_catalog.html",
        {
            "gpu_types": GpuType.objects.all(),
            "pools": NodePool.objects.select_related("region", "gpu_type"),
            "registries": AllowedRegistry.objects.all(),
            "registry_form": AllowedRegistryForm(),
            "policy_form": NewTenantPolicyForm(
                initial={
                    "default_max_gpus": policy.default_max_gpus,
                    "default_max_concurrent_jobs": policy.default_max_concurrent_jobs,
                    "require_credit": policy.require_credit,
                }
            ),
        },
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_new_tenant_policy(request: HttpRequest) -> HttpResponse:
    form = NewTenantPolicyForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            services.new_tenant_policy_set(user=request.user, request=request, **form.cleaned_data)
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(request, "Saved: organisations created from now on start with it.")
            return redirect("marketplace:staff_catalog")
    return render(request, "marketplace/staff_new_tenant_policy.html", {"form": form})


def _staff_model_edit(
    request: HttpRequest,
    form: forms.ModelForm,
    update: Callable[[dict[str, Any]], object],
    title: str,
) -> HttpResponse:
    """The edit page of one catalog row; `update` gets the fields the form changed."""
    if request.method == "POST" and form.is_valid():
        try:
            saved = update({name: form.cleaned_data[name] for name in form.changed_data})
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(request, f"{saved} saved.")
            return redirect("marketplace:staff_catalog")
    return render(
        request,
        "marketplace/staff_edit.html",
        {"form": form, "title": title, "cancel_url": reverse("marketplace:staff_catalog")},
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_gpu_type_edit(request: HttpRequest, gpu_type_slug: str) -> HttpResponse:
    gpu_type = GpuType.objects.filter(slug=gpu_type_slug).first()
    if gpu_type is None:
        raise Http404("Not found.")
    return _staff_model_edit(
        request,
        GpuTypeForm(request.POST or None, instance=gpu_type),
        lambda changes: services.gpu_type_update(
            gpu_type=gpu_type, changes=changes, user=request.user, request=request
        ),
        f"GPU type {gpu_type.slug}",
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_pool_edit(request: HttpRequest, pool_id: int) -> HttpResponse:
    pool = NodePool.objects.filter(pk=pool_id).first()
    if pool is None:
        raise Http404("Not found.")
    return _staff_model_edit(
        request,
        NodePoolForm(request.POST or None, instance=pool),
        lambda changes: services.node_pool_update(
            pool=pool, changes=changes, user=request.user, request=request
        ),
        f"Node pool {pool.slug}",
    )


@staff_required
@require_POST
def staff_registry_add(request: HttpRequest) -> HttpResponse:
    form = AllowedRegistryForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Give a registry host.")
        return redirect("marketplace:staff_catalog")
    try:
        registry = services.allowed_registry_add(
            user=request.user, request=request, **form.cleaned_data
        )
    except ServiceError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"{registry} is allowed for private images.")
    return redirect("marketplace:staff_catalog")


@staff_required
@require_POST
def staff_registry_remove(request: HttpRequest, registry_id: int) -> HttpResponse:
    registry = AllowedRegistry.objects.filter(pk=registry_id).first()
    if registry is None:
        raise Http404("Not found.")
    services.allowed_registry_remove(registry=registry, user=request.user, request=request)
    messages.success(request, f"{registry} removed from the allow-list; existing images stay.")
    return redirect("marketplace:staff_catalog")


@staff_required
@require_http_methods(["GET", "POST"])
def staff_images(request: HttpRequest) -> HttpResponse:
    """Public images: curated by staff, offered to every tenant."""
    image_form = ImageForm(request.POST or None, prefix="new")
    if request.method == "POST":
        image = image_create_from_form(request, image_form, tenant=None)
        if image is not None:
            messages.success(request, f"Public image “{image.name}” published.")
            return redirect("marketplace:staff_images")
    public = Image.objects.filter(tenant__isnull=True).order_by("-is_active", "kind", "name")
    return render(
        request,
        "marketplace/staff_images.html",
        {
            "images": Paginator(public, 50).get_page(request.GET.get("page")),
            "image_form": image_form,
        },
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_image_retire(request: HttpRequest, image_id: int) -> HttpResponse:
    image = Image.objects.filter(pk=image_id, tenant__isnull=True).first()
    if image is None:
        raise Http404("Not found.")
    return confirm_then_act(
        request,
        title="Retire public image",
        message=f"Stop offering “{image.name}” to every tenant for new jobs? Running jobs "
        "are not affected.",
        confirm_label="Retire",
        act=lambda: services.image_deactivate(image=image, user=request.user, request=request),
        success_url=reverse("marketplace:staff_images"),
        success_message=f"“{image.name}” is no longer offered for new jobs.",
        cancel_url=reverse("marketplace:staff_images"),
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_tenant_commercials(request: HttpRequest, tenant_slug: str) -> HttpResponse:
    tenant = Tenant.objects.filter(slug=tenant_slug).first()
    if tenant is None:
        raise Http404("Not found.")
    pricing = TenantPricing.objects.for_tenant(tenant).first()
    pricing_form = TenantPricingForm(
        request.POST if request.POST.get("form") == "pricing" else None,
        initial={
            "discount_percent": pricing.discount_percent if pricing else 0,
            "note": pricing.note if pricing else "",
        },
        prefix="pricing",
    )
    quota_form = TenantQuotaForm(
        request.POST if request.POST.get("form") == "quota" else None, prefix="quota"
    )
    share_form = FairShareForm(
        request.POST if request.POST.get("form") == "share" else None,
        initial={"weight": tenant.fair_share_weight},
        prefix="share",
    )
    forms_by_name = {"pricing": pricing_form, "quota": quota_form, "share": share_form}
    if request.method == "POST":
        try:
            if request.POST.get("form") == "pricing" and pricing_form.is_valid():
                services.tenant_pricing_set(
                    tenant=tenant, user=request.user, request=request, **pricing_form.cleaned_data
                )
                messages.success(request, "Discount saved; it applies to usage from now on.")
                return redirect("marketplace:staff_tenant_commercials", tenant_slug=tenant.slug)
            if request.POST.get("form") == "quota" and quota_form.is_valid():
                services.tenant_quota_set(
                    tenant=tenant, user=request.user, request=request, **quota_form.cleaned_data
                )
                messages.success(request, "Quota saved.")
                return redirect("marketplace:staff_tenant_commercials", tenant_slug=tenant.slug)
            if request.POST.get("form") == "share" and share_form.is_valid():
                tenant_fair_share_set(
                    tenant=tenant,
                    weight=share_form.cleaned_data["weight"],
                    user=request.user,
                    request=request,
                )
                messages.success(request, "Fair-share weight saved; it orders the next admissions.")
                return redirect("marketplace:staff_tenant_commercials", tenant_slug=tenant.slug)
        except ServiceError as error:
            add_service_error(forms_by_name.get(request.POST.get("form", ""), pricing_form), error)
    return render(
        request,
        "marketplace/staff_tenant_commercials.html",
        {
            "tenant": tenant,
            "pricing_form": pricing_form,
            "quota_form": quota_form,
            "share_form": share_form,
            "quotas": TenantQuota.objects.for_tenant(tenant).select_related("gpu_type"),
        },
    )
