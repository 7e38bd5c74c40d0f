"""Marketplace pages: offers, live estimate, image catalog (open to every signed-in user,
staff included); staff pages for the catalog,
price book, tenant pricing and quotas. Thin: parse, call a service/selector, render."""

from __future__ import annotations

from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from console.models import Tenant
from console.permissions import Capability, capability_required, has_capability, staff_required
from console.services import ServiceError, audit_record
from console.tenancy import get_for_tenant_or_404
from marketplace import selectors, services
from marketplace.forms import (
    AllowedRegistryForm,
    EstimateForm,
    GpuTypeForm,
    ImageFilterForm,
    ImageForm,
    NodePoolForm,
    OfferFilterForm,
    PriceVersionForm,
    RegistryCredentialForm,
    TenantPricingForm,
    TenantQuotaForm,
)
from marketplace.models import (
    AllowedRegistry,
    GpuType,
    Image,
    NodePool,
    PriceVersion,
    Region,
    RegistryCredential,
    TenantPricing,
    TenantQuota,
)
from marketplace.pricing import PricingError, estimate_cost


def _form_error(form, error: ServiceError | PricingError) -> None:
    form.add_error(error.field if error.field in form.fields else None, error.message)


# --- offers and estimate ----


@login_required
def offers(request: HttpRequest) -> HttpResponse:
    form = OfferFilterForm(request.GET or None)
    filters = form.cleaned_data if form.is_valid() else {}
    rows = selectors.offers(
        tenant=request.tenant,
        vendor=filters.get("vendor") or None,
        min_memory_gib=filters.get("min_memory_gib"),
        region=filters["region"].slug if filters.get("region") else None,
        tier=filters.get("tier") or None,
        available_only=bool(filters.get("available")),
        sort=filters.get("sort") or "price",
    )
    context = {
        "form": form,
        "gpu_offers": [o for o in rows if not o.is_cpu],
        "cpu_offers": [o for o in rows if o.is_cpu],
        "estimate_form": EstimateForm(
            initial={"region": "us-west", "gpu_type": "a100-80gb", "spot_ratio": "0.7", "hours": 24}
        ),
    }
    if request.htmx and request.htmx.target == "offers-table":
        return render(request, "marketplace/offers.html#offers-table", context)
    return render(request, "marketplace/offers.html", context)


@login_required
def estimate(request: HttpRequest) -> HttpResponse:
    """Live estimate partial (htmx, as the user types); also a full page without JS."""
    form = EstimateForm(request.GET or None)
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
            _form_error(form, error)
    template = "marketplace/partials/estimate.html" if request.htmx else "marketplace/estimate.html"
    return render(request, template, {"estimate_form": form, "estimate": result})


# --- image catalog ----


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
            image = _image_create_from_form(request, image_form, tenant=request.tenant)
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


def _image_create_from_form(request: HttpRequest, form: ImageForm, *, tenant) -> Image | None:
    """Create a public (tenant None) or private image from the posted form; on a refusal
    the form carries the error and None is returned."""
    if not form.is_valid():
        return None
    data = dict(form.cleaned_data)
    try:
        return services.image_create(
            tenant=tenant,
            slug=data.pop("slug"),
            reference=data.pop("reference"),
            user=request.user,
            request=request,
            **{k: (v if v is not None else []) for k, v in data.items()},
        )
    except ServiceError as error:
        _form_error(form, error)
        return None


def _registry_credential_save(request: HttpRequest, form: RegistryCredentialForm) -> bool:
    if not form.is_valid():
        return False
    try:
        credential = services.registry_credential_set(
            tenant=request.tenant, user=request.user, request=request, **form.cleaned_data
        )
    except ServiceError as error:
        _form_error(form, error)
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
    if request.method == "POST":
        services.registry_credential_delete(
            credential=credential, user=request.user, request=request
        )
        messages.success(request, f"Login for {credential.registry} removed.")
        return redirect(f"{reverse('marketplace:images')}#registry-logins")
    return render(
        request,
        "partials/confirm.html",
        {
            "title": "Remove registry login",
            "message": f"Remove the login for {credential.registry}? Jobs launched later from "
            "its private images can't pull them; running jobs are not affected.",
            "confirm_label": "Remove",
            "cancel_url": reverse("marketplace:images"),
        },
    )


@capability_required(Capability.MANAGE_PRIVATE_IMAGES)
@require_http_methods(["GET", "POST"])
def image_deactivate(request: HttpRequest, image_id: int) -> HttpResponse:
    image = get_for_tenant_or_404(
        Image.objects.owned_by(request.tenant), request.tenant, pk=image_id
    )
    if request.method == "POST":
        services.image_deactivate(image=image, user=request.user, request=request)
        messages.success(request, f"“{image.name}” is no longer offered for new jobs.")
        return redirect("marketplace:images")
    return render(
        request,
        "partials/confirm.html",
        {
            "title": "Retire private image",
            "message": f"Stop offering “{image.name}” for new jobs? Running jobs are not affected.",
            "confirm_label": "Retire",
            "cancel_url": reverse("marketplace:images"),
        },
    )


# --- staff: price book ----


def _price_rows_from_post(request: HttpRequest) -> tuple[list[services.PriceRow], list[str]]:
    """The price table inputs are named price-<gpu slug or cpu>-<region slug>."""
    rows, errors = [], []
    gpu_types = {g.slug: g for g in GpuType.objects.all()}
    regions = {r.slug: r for r in Region.objects.all()}
    for key, value in request.POST.items():
        if not key.startswith("price|") or not value.strip():
            continue
        _, gpu_slug, region_slug = key.split("|", 2)
        if region_slug not in regions or (gpu_slug != "cpu" and gpu_slug not in gpu_types):
            errors.append(f"Unknown price cell {key}.")
            continue
        try:
            price = Decimal(value.strip())
        except ArithmeticError:
            errors.append(f"“{value}” is not a number ({gpu_slug} in {region_slug}).")
            continue
        if not price.is_finite() or price <= 0:
            errors.append(f"Prices are above zero ({gpu_slug} in {region_slug}).")
            continue
        rows.append(
            services.PriceRow(
                gpu_type=gpu_types.get(gpu_slug), region=regions[region_slug], on_demand_price=price
            )
        )
    return rows, errors


def _price_grid(version: PriceVersion | None, posted: dict | None = None) -> dict:
    regions = list(selectors.regions_active())
    gpu_types = list(GpuType.objects.all())
    current = {}
    if version is not None:
        current = {
            (e.gpu_type.slug if e.gpu_type else "cpu", e.region.slug): e.on_demand_price
            for e in version.entries.select_related("gpu_type", "region")
        }
    grid = []
    for label, slug in [(str(g), g.slug) for g in gpu_types] + [("CPU (per vCPU-hour)", "cpu")]:
        cells = []
        for region in regions:
            name = f"price|{slug}|{region.slug}"
            value = posted.get(name) if posted is not None else current.get((slug, region.slug))
            cells.append({"name": name, "value": value if value is not None else ""})
        grid.append({"label": label, "cells": cells})
    return {"regions": regions, "grid": grid}


@staff_required
@require_http_methods(["GET", "POST"])
def staff_prices(request: HttpRequest) -> HttpResponse:
    in_force = PriceVersion.objects.in_force()
    initial = {"currency": in_force.currency if in_force else "USD"}
    if in_force:
        initial.update(
            {
                f: getattr(in_force, f)
                for f in (
                    "spot_discount_percent",
                    "reserved_1m_discount_percent",
                    "reserved_3m_discount_percent",
                    "reserved_12m_discount_percent",
                )
            }
        )
    form = PriceVersionForm(request.POST or None, initial=initial)
    preview = None
    if request.method == "POST":
        rows, errors = _price_rows_from_post(request)
        for error in errors:
            form.add_error(None, error)
        if form.is_valid():
            data = form.cleaned_data
            if request.POST.get("action") == "publish":
                try:
                    version = services.price_version_publish(
                        effective_from=data["effective_from"],
                        rows=rows,
                        spot_discount_percent=data["spot_discount_percent"],
                        reserved_discount_percent={
                            1: data["reserved_1m_discount_percent"],
                            3: data["reserved_3m_discount_percent"],
                            12: data["reserved_12m_discount_percent"],
                        },
                        currency=data["currency"],
                        note=data["note"],
                        user=request.user,
                        request=request,
                    )
                except ServiceError as error:
                    _form_error(form, error)
                else:
                    messages.success(
                        request,
                        f"Price version {version.pk} published, effective "
                        f"{version.effective_from:%Y-%m-%d %H:%M} UTC.",
                    )
                    return redirect("marketplace:staff_prices")
            else:
                preview = services.price_version_preview(rows=rows)
    from billing.selectors import price_gaps  # billing builds on the catalog, not back

    context = {
        "form": form,
        "preview": preview,
        "in_force": in_force,
        "price_gaps": price_gaps(),
        "versions": Paginator(selectors.price_versions(), 20).get_page(request.GET.get("page")),
        **_price_grid(in_force, request.POST if request.method == "POST" else None),
    }
    return render(request, "marketplace/staff_prices.html", context)


@staff_required
@require_http_methods(["GET", "POST"])
def staff_price_version(request: HttpRequest, version_id: int) -> HttpResponse:
    version = PriceVersion.objects.filter(pk=version_id).first()
    if version is None:
        raise Http404("Not found.")
    if request.method == "POST":
        try:
            services.price_version_withdraw(version=version, user=request.user, request=request)
        except ServiceError as error:
            messages.error(request, error.message)
            return redirect("marketplace:staff_price_version", version_id=version.pk)
        messages.success(request, "The scheduled price version was withdrawn.")
        return redirect("marketplace:staff_prices")
    entries = version.entries.select_related("gpu_type", "region").order_by(
        "gpu_type__vendor", "gpu_type__slug", "region__slug"
    )
    return render(
        request, "marketplace/staff_price_version.html", {"version": version, "entries": entries}
    )


# --- staff: catalog ----


@staff_required
def staff_catalog(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "marketplace/staff_catalog.html",
        {
            "gpu_types": GpuType.objects.all(),
            "pools": NodePool.objects.select_related("region", "gpu_type"),
            "registries": AllowedRegistry.objects.all(),
            "registry_form": AllowedRegistryForm(),
        },
    )


def _staff_model_edit(request, instance, form_class, action: str, title: str):
    form = form_class(request.POST or None, instance=instance)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            saved = form.save()
            audit_record(
                action=action,
                actor=request.user,
                target=saved,
                request=request,
                metadata={"changed": form.changed_data},
            )
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
        request, gpu_type, GpuTypeForm, "gpu_type.changed", f"GPU type {gpu_type.slug}"
    )


@staff_required
@require_http_methods(["GET", "POST"])
def staff_pool_edit(request: HttpRequest, pool_id: int) -> HttpResponse:
    pool = NodePool.objects.filter(pk=pool_id).first()
    if pool is None:
        raise Http404("Not found.")
    return _staff_model_edit(
        request, pool, NodePoolForm, "node_pool.changed", f"Node pool {pool.slug}"
    )


@staff_required
@require_POST
def staff_registry_add(request: HttpRequest) -> HttpResponse:
    form = AllowedRegistryForm(request.POST)
    if form.is_valid():
        registry, created = AllowedRegistry.objects.get_or_create(
            host=form.cleaned_data["host"].strip().lower(),
            path_prefix=form.cleaned_data["path_prefix"].strip("/"),
            defaults={"note": form.cleaned_data["note"]},
        )
        if created:
            audit_record(
                action="registry.allowed", actor=request.user, target=registry, request=request
            )
        messages.success(request, f"{registry} is allowed for private images.")
    else:
        messages.error(request, "Give a registry host.")
    return redirect("marketplace:staff_catalog")


@staff_required
@require_POST
def staff_registry_remove(request: HttpRequest, registry_id: int) -> HttpResponse:
    registry = AllowedRegistry.objects.filter(pk=registry_id).first()
    if registry is None:
        raise Http404("Not found.")
    audit_record(action="registry.removed", actor=request.user, target=registry, request=request)
    registry.delete()
    messages.success(request, f"{registry} removed from the allow-list; existing images stay.")
    return redirect("marketplace:staff_catalog")


@staff_required
@require_http_methods(["GET", "POST"])
def staff_images(request: HttpRequest) -> HttpResponse:
    """Public images: curated by staff, offered to every tenant."""
    image_form = ImageForm(request.POST or None, prefix="new")
    if request.method == "POST":
        image = _image_create_from_form(request, image_form, tenant=None)
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
    if request.method == "POST":
        services.image_deactivate(image=image, user=request.user, request=request)
        messages.success(request, f"“{image.name}” is no longer offered for new jobs.")
        return redirect("marketplace:staff_images")
    return render(
        request,
        "partials/confirm.html",
        {
            "title": "Retire public image",
            "message": f"Stop offering “{image.name}” to every tenant for new jobs? Running jobs "
            "are not affected.",
            "confirm_label": "Retire",
            "cancel_url": reverse("marketplace:staff_images"),
        },
    )


# --- staff: tenant pricing and quotas ----


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
        except ServiceError as error:
            _form_error(quota_form if request.POST.get("form") == "quota" else pricing_form, error)
    return render(
        request,
        "marketplace/staff_tenant_commercials.html",
        {
            "tenant": tenant,
            "pricing_form": pricing_form,
            "quota_form": quota_form,
            "quotas": TenantQuota.objects.for_tenant(tenant).select_related("gpu_type"),
        },
    )
