"""The staff price book: the price grid, preview and publication of dated price
versions, and withdrawing a scheduled one. Panels from the apps above (billing's usage
without a price) come in through `marketplace.extensions`."""

from __future__ import annotations

from decimal import Decimal

from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_http_methods

from console.forms import add_service_error
from console.permissions import staff_required
from console.service_errors import ServiceError
from marketplace import extensions, selectors, services
from marketplace.forms import PriceVersionForm
from marketplace.models import GpuType, PriceVersion, Region


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


def _storage_prices_from_post(
    request: HttpRequest,
) -> tuple[dict[Region, Decimal] | None, list[str]]:
    """Storage cells are storage|<region slug>, per GiB-month (kept per GiB-hour); an
    empty cell: no storage price there. None when the form sent no storage cells (the
    version in force's are kept)."""
    cells = {k: v for k, v in request.POST.items() if k.startswith("storage|")}
    if not cells:
        return None, []
    regions = {r.slug: r for r in Region.objects.all()}
    prices, errors = {}, []
    for key, value in cells.items():
        region = regions.get(key.split("|", 1)[1])
        if region is None:
            errors.append(f"Unknown storage price cell {key}.")
            continue
        if not value.strip():
            continue
        try:
            per_month = Decimal(value.strip())
        except ArithmeticError:
            errors.append(f"“{value}” is not a number (storage in {region.slug}).")
            continue
        if not per_month.is_finite() or per_month < 0:
            errors.append(f"Storage prices are zero or more (storage in {region.slug}).")
            continue
        prices[region] = services.storage_price_per_gib_hour(per_month)
    return prices, errors


def _reserved(data: dict) -> dict[int, Decimal]:
    return {m: data[f"reserved_{m}m_discount_percent"] for m in (1, 3, 12)}


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
            cells.append(
                {"name": name, "value": value if value is not None else "", "region": region}
            )
        grid.append({"label": label, "cells": cells})
    storage = {}
    if version is not None:
        storage = {
            p.region.slug: services.storage_price_per_gib_month(p.price_per_gib_hour)
            for p in version.storage_prices.select_related("region")
        }
    storage_cells = []
    for region in regions:
        name = f"storage|{region.slug}"
        value = posted.get(name) if posted is not None else storage.get(region.slug)
        storage_cells.append(
            {"name": name, "value": value if value is not None else "", "region": region}
        )
    return {"regions": regions, "grid": grid, "storage_cells": storage_cells}


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
        storage_prices, storage_errors = _storage_prices_from_post(request)
        for error in [*errors, *storage_errors]:
            form.add_error(None, error)
        if form.is_valid():
            data = form.cleaned_data
            if request.POST.get("action") == "publish":
                try:
                    version = services.price_version_publish(
                        effective_from=data["effective_from"],
                        rows=rows,
                        spot_discount_percent=data["spot_discount_percent"],
                        reserved_discount_percent=_reserved(data),
                        currency=data["currency"],
                        note=data["note"],
                        user=request.user,
                        request=request,
                        storage_prices=storage_prices,
                    )
                except ServiceError as error:
                    add_service_error(form, error)
                else:
                    messages.success(
                        request,
                        f"Price version {version.pk} published, effective "
                        f"{version.effective_from:%Y-%m-%d %H:%M} UTC.",
                    )
                    return redirect("marketplace:staff_prices")
            else:
                preview = services.price_version_preview(
                    rows=rows,
                    spot_discount_percent=data["spot_discount_percent"],
                    reserved_discount_percent=_reserved(data),
                    storage_prices=storage_prices,
                )
    context = {
        "form": form,
        "preview": preview,
        "in_force": in_force,
        "panels": [
            render_to_string(panel.template_name, panel.context, request=request)
            for panel in extensions.price_book_panels()
        ],
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
