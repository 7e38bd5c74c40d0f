"""Shared by the catalog and staff pages: image creation from the image form (private on
the catalog, public on staff pages)."""

from __future__ import annotations

from django.http import HttpRequest

from console.forms import add_service_error
from console.models import Tenant
from console.service_errors import ServiceError
from marketplace import services
from marketplace.forms import ImageForm
from marketplace.models import Image


def image_create_from_form(
    request: HttpRequest, form: ImageForm, *, tenant: Tenant | None
) -> Image | None:
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
        add_service_error(form, error)
        return None
