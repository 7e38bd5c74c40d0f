"""Registry logins for private images: stored encrypted once, never shown again (page,
API, audit), one per allow-listed registry and tenant, reached only by their tenant."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.crypto import decrypt_json
from console.models import AuditEvent
from console.service_errors import ServiceError
from marketplace import services
from marketplace.models import RegistryCredential
from marketplace.selectors import registry_login_for_image
from tests.conftest import signed_in_client, token_client

IMAGES = reverse("marketplace:images")
API = "/api/v1/registry-credentials"
PASSWORD = "ghp_very-secret-token"


def save(world, registry="ghcr.io", password=PASSWORD, username="robot"):
    return services.registry_credential_set(
        tenant=world.tenant,
        user=world.admin,
        registry=registry,
        username=username,
        password=password,
    )


def test_login_is_stored_encrypted_and_replaced_per_registry(catalog, world):
    first = save(world, registry="https://GHCR.io/")
    assert first.registry == "ghcr.io"
    assert PASSWORD not in first.password_encrypted
    assert decrypt_json(first.password_encrypted) == {"password": PASSWORD}

    second = save(world, password="rotated", username="robot2")
    assert second.pk == first.pk
    assert RegistryCredential.objects.for_tenant(world.tenant).count() == 1
    assert decrypt_json(second.password_encrypted) == {"password": "rotated"}
    actions = list(
        AuditEvent.objects.filter(action__startswith="registry_credential").values_list(
            "action", flat=True
        )
    )
    assert sorted(actions) == ["registry_credential.created", "registry_credential.updated"]
    assert not AuditEvent.objects.filter(metadata__icontains="rotated").exists()


@pytest.mark.parametrize(
    ("registry", "username", "password", "field"),
    [
        ("quay.io", "robot", "x", "registry"),  # not allow-listed
        ("", "robot", "x", "registry"),
        ("ghcr.io", "", "x", "username"),
        ("ghcr.io", "robot", "", "password"),
    ],
)
def test_bad_logins_are_refused(catalog, world, registry, username, password, field):
    with pytest.raises(ServiceError) as refused:
        save(world, registry=registry, username=username, password=password)
    assert refused.value.field == field
    assert not RegistryCredential.objects.exists()


def test_login_for_an_image_is_its_tenants_for_its_registry(catalog, world, other_world):
    save(world)
    login = registry_login_for_image(tenant=world.tenant, image_reference="ghcr.io/acme/t:1")
    assert (login.registry, login.username, login.password) == ("ghcr.io", "robot", PASSWORD)
    assert PASSWORD not in repr(login)
    assert (
        registry_login_for_image(tenant=other_world.tenant, image_reference="ghcr.io/a/t:1") is None
    )
    assert registry_login_for_image(tenant=world.tenant, image_reference="nvcr.io/n/p:1") is None


def test_admin_saves_a_login_on_the_images_page_and_it_is_masked(catalog, world):
    client = signed_in_client(world.admin, world.tenant)
    response = client.post(
        IMAGES,
        {
            "form": "registry-credential",
            "login-registry": "ghcr.io",
            "login-username": "robot",
            "login-password": PASSWORD,
        },
    )
    assert response.status_code == 302
    credential = RegistryCredential.objects.get(tenant=world.tenant)
    page = client.get(IMAGES).content.decode()
    assert "robot" in page and "ghcr.io" in page
    assert PASSWORD not in page
    secrets_page = client.get(reverse("jobs:secrets")).content.decode()
    assert "ghcr.io" in secrets_page and PASSWORD not in secrets_page

    remove = reverse("marketplace:registry_credential_delete", args=[credential.pk])
    assert client.get(remove).status_code == 200
    assert client.post(remove).status_code == 302
    assert not RegistryCredential.objects.exists()


def test_a_refused_login_shows_a_field_error_and_keeps_no_password(catalog, world):
    client = signed_in_client(world.admin, world.tenant)
    response = client.post(
        IMAGES,
        {
            "form": "registry-credential",
            "login-registry": "ghcr.io",
            "login-username": "",
            "login-password": PASSWORD,
        },
    )
    assert response.status_code == 200
    assert response.context["credential_form"].errors["username"]
    assert PASSWORD not in response.content.decode()


@pytest.mark.parametrize("role", ["member", "viewer", "finance"])
def test_only_admins_change_logins(catalog, world, role):
    credential = save(world)
    client = signed_in_client(getattr(world, role), world.tenant)
    posted = {
        "form": "registry-credential",
        "login-registry": "ghcr.io",
        "login-username": "x",
        "login-password": "y",
    }
    assert client.post(IMAGES, posted).status_code in (403, 404)
    remove = reverse("marketplace:registry_credential_delete", args=[credential.pk])
    assert client.post(remove).status_code == 403
    api = token_client(getattr(world, role), world.tenant)
    body = {"registry": "ghcr.io", "username": "x", "password": "y"}
    assert api.post(API, body, format="json").status_code == 403
    assert api.delete(f"{API}/{credential.pk}").status_code == 403
    assert api.get(API).status_code == 200  # members see which registries have a login
    credential.refresh_from_db()
    assert credential.username == "robot"


def test_api_creates_lists_masks_and_deletes(catalog, world):
    api = token_client(world.owner, world.tenant)
    created = api.post(
        API, {"registry": "ghcr.io", "username": "robot", "password": PASSWORD}, format="json"
    )
    assert created.status_code == 201, created.data
    assert created.data["password"] == "••••••"
    listed = api.get(API)
    assert PASSWORD not in listed.content.decode()
    (row,) = listed.data["results"]
    assert (row["registry"], row["username"], row["password"]) == ("ghcr.io", "robot", "••••••")
    refused = api.post(
        API, {"registry": "quay.io", "username": "r", "password": "p"}, format="json"
    )
    assert refused.status_code == 400
    assert api.delete(f"{API}/{row['id']}").status_code == 204
    assert not RegistryCredential.objects.exists()


def test_another_tenants_login_is_404(catalog, world, other_world):
    theirs = save(other_world)
    client = signed_in_client(world.admin, world.tenant)
    remove = reverse("marketplace:registry_credential_delete", args=[theirs.pk])
    assert client.get(remove).status_code == 404
    assert client.post(remove).status_code == 404
    api = token_client(world.owner, world.tenant)
    assert api.get(f"{API}/{theirs.pk}").status_code == 404
    assert api.delete(f"{API}/{theirs.pk}").status_code == 404
    assert "robot" not in api.get(API).content.decode()
    assert RegistryCredential.objects.filter(pk=theirs.pk).exists()
