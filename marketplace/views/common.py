"""Helpers shared by the catalog and staff pages: a service's refusal shown on its form,
and image creation from the image form (private on the catalog, public on staff pages)."""

from __future__ import annotations

from django import forms
from django.http import HttpRequest

from console.models import Tenant
from console.services import ServiceError
from marketplace import services
from marketplace.forms import ImageForm
from marketplace.models import Image
from marketplace.pricing import PricingError


def form_error(form: forms.BaseForm, error: ServiceError | PricingError) -> None:
    form.add_error(error.field if error.field in form.fields else None, error.message)


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
        form_error(form, error)
        return None
