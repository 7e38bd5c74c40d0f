"""Issue 13 §4: a private image can't take a public image's slug (the launch form used to
crash with a 500 on the clash), and a clash already in the data doesn't break launching."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.service_errors import ServiceError
from jobs.forms import LaunchForm
from marketplace.models import Image
from marketplace.services import image_create
from tests.conftest import signed_in_client, token_client
from tests.factories import ImageFactory
from tests.jobs_helpers import submit


def test_the_service_refuses_a_private_image_with_a_public_slug(catalog, world):
    with pytest.raises(ServiceError) as refused:
        image_create(
            tenant=world.tenant,
            user=world.admin,
            slug="pytorch-2-5-cuda12-4",
            reference="ghcr.io/acme/trainer:1.4.2",
            name="Mine",
            kind="framework",
            compatible_with=["cpu"],
        )
    assert refused.value.field == "slug"
    assert not Image.objects.filter(tenant=world.tenant).exists()


def test_the_api_refuses_it_on_slug(catalog, world):
    api = token_client(world.admin, world.tenant)
    body = {
        "slug": "pytorch-2-5-cuda12-4",
        "name": "Shadow",
        "reference": "ghcr.io/acme/trainer:1.4.2",
        "kind": "framework",
        "compatible_with": ["cpu"],
    }

    response = api.post("/api/v1/images", body, format="json")

    assert response.status_code == 409, response.content  # as for a clash within the tenant
    assert "exists already" in str(response.json()["slug"])
    assert not Image.objects.filter(tenant=world.tenant).exists()
    # Any other slug is fine, and another tenant's private slug is no clash.
    assert api.post("/api/v1/images", {**body, "slug": "shadow"}, format="json").status_code == 201


@pytest.fixture
def clash(catalog, world):
    """A private image made before clashes were refused, shadowing a public slug."""
    public = Image.objects.get(slug="python-3.11", tenant=None)
    private = ImageFactory(
        tenant=world.tenant, slug="python-3.11", reference="ghcr.io/acme/shadow:1"
    )
    return public, private


def test_the_launch_form_renders_and_resolves_the_public_image(clash, world):
    public, _ = clash
    client = signed_in_client(world.member, world.tenant)

    assert client.get(reverse("jobs:launch")).status_code == 200

    form = LaunchForm(data={"image": "python-3.11"}, tenant=world.tenant)
    form.is_valid()
    assert "image" not in form.errors
    assert form.cleaned_data["image"] == public


def test_a_job_launched_by_slug_gets_the_public_image_on_a_clash(clash, world):
    public, _ = clash

    job = submit(world, "x", image="python-3.11")

    assert job.image == public
    assert job.image_reference == public.reference
