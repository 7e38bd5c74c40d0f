"""The Storage page: the organisation's volumes, creating, growing and deleting them."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from console.confirm import confirm_then_act
from console.forms import add_service_error
from console.permissions import Capability, capability_required, has_capability
from console.service_errors import ServiceError
from console.tenancy import get_for_tenant_or_404
from marketplace.selectors import regions_for_tenant
from storage import selectors, services
from storage.forms import VolumeCreateForm, VolumeFillForm, VolumeResizeForm
from storage.models import Volume


def _live_volume(request: HttpRequest, volume_id: int) -> Volume:
    return get_for_tenant_or_404(
        Volume.objects.filter(deleted_at=None), request.tenant, pk=volume_id
    )


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def volumes(request: HttpRequest) -> HttpResponse:
    can_manage = has_capability(request.membership, Capability.LAUNCH_JOBS)
    usable = list(regions_for_tenant(request.tenant).order_by("slug"))
    regions = [(r.slug, r.name) for r in usable]
    region_names = {r.pk: r.name for r in usable}
    form = VolumeCreateForm(request.POST or None, regions=regions)
    if request.method == "POST":
        if not can_manage:
            raise Http404("Not found.")
        if form.is_valid():
            try:
                volume = services.volume_create(
                    tenant=request.tenant, user=request.user, request=request, **form.cleaned_data
                )
            except ServiceError as error:
                add_service_error(form, error)
            else:
                messages.success(request, f"Volume {volume.name} created ({volume.size_gib} GiB).")
                return redirect("storage:volumes")
    listed = list(selectors.volumes_for_tenant(tenant=request.tenant))
    prices = selectors.storage_prices_per_gib_month()
    for volume in listed:  # what a month of the volume costs at today's price
        price = prices.get(volume.region_id)
        volume.monthly = (price[0] * volume.size_gib, price[1]) if price else None
    return render(
        request,
        "storage/volumes.html",
        {
            "form": form,
            "can_manage": can_manage,
            "volumes": listed,
            "total_gib": sum(v.size_gib for v in listed),
            "region_prices": [
                (name, prices[pk]) for pk, name in region_names.items() if pk in prices
            ],
        },
    )


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def volume_resize(request: HttpRequest, volume_id: int) -> HttpResponse:
    volume = _live_volume(request, volume_id)
    form = VolumeResizeForm(request.POST or None, initial={"size_gib": volume.size_gib})
    if request.method == "POST" and form.is_valid():
        try:
            services.volume_resize(
                volume=volume,
                user=request.user,
                size_gib=form.cleaned_data["size_gib"],
                request=request,
            )
        except ServiceError as error:
            add_service_error(form, error)
        else:
            messages.success(
                request, f"Volume {volume.name} is now {form.cleaned_data['size_gib']} GiB."
            )
            return redirect("storage:volumes")
    return render(request, "storage/resize.html", {"form": form, "volume": volume})


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["GET", "POST"])
def volume_delete(request: HttpRequest, volume_id: int) -> HttpResponse:
    volume = _live_volume(request, volume_id)
    return confirm_then_act(
        request,
        title="Delete volume",
        message=f"Delete {volume.name} ({volume.size_gib} GiB) and every file on it? This "
        "can't be undone.",
        confirm_label="Delete volume",
        act=lambda: services.volume_delete(volume=volume, user=request.user, request=request),
        success_url=reverse("storage:volumes"),
        success_message=f"Volume {volume.name} deleted.",
        cancel_url=reverse("storage:volumes"),
    )


@capability_required(Capability.VIEW_TENANT)
@require_http_methods(["GET", "POST"])
def volume_detail(request: HttpRequest, volume_id: int) -> HttpResponse:
    """A volume: its size, price and the fill (a copy into it) with live progress; the
    progress section polls itself while a fill is active."""
    volume = _live_volume(request, volume_id)
    can_manage = has_capability(request.membership, Capability.LAUNCH_JOBS)
    form = VolumeFillForm(request.POST or None)
    if request.method == "POST":
        if not can_manage:
            raise Http404("Not found.")
        if form.is_valid():
            try:
                services.volume_fill_start(
                    volume=volume, user=request.user, request=request, **form.cleaned_data
                )
            except ServiceError as error:
                add_service_error(form, error)
            else:
                messages.success(
                    request, f"Filling {volume.name} from {form.cleaned_data['source']}."
                )
                return redirect("storage:volume_detail", volume_id=volume.pk)
    fill = selectors.latest_fill(volume)
    context = {"volume": volume, "fill": fill, "form": form, "can_manage": can_manage}
    if request.htmx:
        return render(request, "storage/detail.html#fill-progress", context)
    return render(request, "storage/detail.html", context)


@capability_required(Capability.LAUNCH_JOBS)
@require_http_methods(["POST"])
def volume_fill_cancel(request: HttpRequest, volume_id: int) -> HttpResponse:
    volume = _live_volume(request, volume_id)
    try:
        services.volume_fill_cancel(volume=volume, user=request.user, request=request)
    except ServiceError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"The fill of {volume.name} was cancelled.")
    return redirect("storage:volume_detail", volume_id=volume.pk)
