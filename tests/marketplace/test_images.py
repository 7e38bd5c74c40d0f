"""Image references (parse_reference, is_allowed) and the image services: private images
only from allow-listed registries, seen by their own tenant only."""

from __future__ import annotations

import pytest

from console.models import AuditEvent
from console.service_errors import ServiceError
from marketplace import services
from marketplace.images import ImageReference, InvalidReference, is_allowed, parse_reference
from marketplace.models import Image
from marketplace.selectors import images_for_tenant
from tests.marketplace.helpers import demo_image_slugs

DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("text", "registry", "path", "tag", "digest"),
    [
        ("nvcr.io/nvidia/pytorch:24.10-py3", "nvcr.io", "nvidia/pytorch", "24.10-py3", None),
        ("ghcr.io/acme/trainer@" + DIGEST, "ghcr.io", "acme/trainer", None, DIGEST),
        ("ghcr.io/acme/trainer:1.4.2@" + DIGEST, "ghcr.io", "acme/trainer", "1.4.2", DIGEST),
        (
            "registry.example.com:5000/team/a/b:v1",
            "registry.example.com:5000",
            "team/a/b",
            "v1",
            None,
        ),
        ("localhost:5000/trainer:dev", "localhost:5000", "trainer", "dev", None),
        ("localhost/trainer:dev", "localhost", "trainer", "dev", None),
        ("  docker.io/library/ubuntu:22.04  ", "docker.io", "library/ubuntu", "22.04", None),
        ("Docker.IO/library/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
        ("my_org/my-repo__x:1.0", "docker.io", "my_org/my-repo__x", "1.0", None),
    ],
)
def test_parse_reference_accepts_pinned_references(text, registry, path, tag, digest):
    parsed = parse_reference(text)
    assert parsed == ImageReference(registry=registry, path=path, tag=tag, digest=digest)


@pytest.mark.parametrize(
    "text", ["ubuntu:22.04", "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", "ubuntu@" + DIGEST]
)
def test_docker_hub_short_names_are_normalised_to_docker_io(text):
    normalised = str(parse_reference(text))
    assert normalised.startswith("docker.io/")
    assert normalised.endswith(text)
    assert parse_reference(normalised) == parse_reference(text)  # stable


@pytest.mark.parametrize(
    "text",
    [
        "",
        "   ",
        "ubuntu",  # unpinned: an implicit :latest
        "docker.io/library/ubuntu",
        "ghcr.io/acme/trainer",
        "docker.io/library/Ubuntu:22.04",  # repository paths are lowercase
        "ghcr.io/Acme/trainer:1",
        "Ubuntu:22.04",
        "ghcr.io/acme/trainer :1",
        "ghcr.io/acme/trainer:1 2",
        "ghcr.io/acme/trainer:1;rm -rf /",
        "ghcr.io/acme/trainer:1;id",
        "ghcr.io/acme/trainer:$(id)",
        "ghcr.io/acme/$(id):1",
        "ghcr.io/acme/trainer:`id`",
        "ghcr.io/acme/trainer:1|sh",
        "ghcr.io/acme/trainer:1&&id",
        "ghcr.io/acme/trainer:1\nid",
        "ghcr.io/acme/trainer:1>x",
        "ghcr.io/acme/trainer@sha256:1234",  # short digest
        "ghcr.io/acme/trainer@sha256:" + "A" * 64,  # uppercase hex
        "ghcr.io/acme/trainer@md5:" + "a" * 32,
        "ghcr.io/acme/trainer:" + "a" * 129,  # tag over 128 characters
        "ghcr.io/" + "a/" * 200 + "b:1",  # over 400 characters
        "ghcr.io//acme:1",
        "-acme/trainer:1",
        "ghcr.io/acme/trainer:-1",
        "https://ghcr.io/acme/trainer:1",
    ],
)
def test_parse_reference_refuses(text):
    with pytest.raises(InvalidReference):
        parse_reference(text)


@pytest.mark.parametrize("text", ["Library/ubuntu:22.04", "MyOrg/trainer:1.0"])
def test_uppercase_first_path_component_is_refused(text):
    with pytest.raises(InvalidReference):
        parse_reference(text)


@pytest.mark.parametrize("text", ["ghcr.io/acme/trainer:tägé", "ghcr.io/acme/trainer:١٢٣"])
def test_non_ascii_tags_are_refused(text):
    with pytest.raises(InvalidReference):
        parse_reference(text)


def test_a_reference_at_the_length_limit_is_accepted():
    text = "ghcr.io/" + "a" * (400 - len("ghcr.io/") - 2) + ":1"
    assert len(text) == 400
    assert str(parse_reference(text)) == text


@pytest.mark.parametrize(
    ("text", "allowed", "expected"),
    [
        ("ghcr.io/acme/x:1", [("ghcr.io", "")], True),
        ("ghcr.io/acme/x:1", [("GHCR.io", "")], True),
        ("ghcr.io/acme/x:1", [("ghcr.io", "acme")], True),
        ("ghcr.io/acme/x:1", [("ghcr.io", "/acme/")], True),
        ("ghcr.io/acme:1", [("ghcr.io", "acme")], True),
        ("ghcr.io/acme-evil/x:1", [("ghcr.io", "acme")], False),
        ("ghcr.io/other/x:1", [("ghcr.io", "acme")], False),
        ("quay.io/acme/x:1", [("ghcr.io", "")], False),
        ("ghcr.io.evil.com/acme/x:1", [("ghcr.io", "")], False),
        ("registry.example.com:5000/a:1", [("registry.example.com", "")], False),
        ("registry.example.com:5000/a:1", [("registry.example.com:5000", "")], True),
        ("ubuntu:22.04", [("docker.io", "")], True),
        ("ghcr.io/acme/x:1", [], False),
    ],
)
def test_is_allowed(text, allowed, expected):
    assert is_allowed(parse_reference(text), allowed) is expected


# --- services ----


def private_image(tenant, user, *, slug="trainer", reference="ghcr.io/acme/trainer:1.4.2", **kw):
    fields = {"name": "Trainer", "kind": "framework", "compatible_with": ["nvidia"], **kw}
    return services.image_create(tenant=tenant, slug=slug, reference=reference, user=user, **fields)


def test_image_create_private_from_an_allowed_registry(catalog, world):
    image = private_image(world.tenant, world.admin, reference="nvcr.io/nvidia/pytorch:24.10-py3")

    assert image.tenant == world.tenant
    assert image.reference == "nvcr.io/nvidia/pytorch:24.10-py3"
    event = AuditEvent.objects.get(action="image.created")
    assert (event.tenant, event.actor) == (world.tenant, world.admin)
    assert event.metadata["public"] is False


def test_image_create_normalises_the_reference(catalog, world):
    image = private_image(world.tenant, world.admin, reference="  acme/trainer:1.0 ")
    assert image.reference == "docker.io/acme/trainer:1.0"


@pytest.mark.parametrize(
    "reference", ["quay.io/acme/trainer:1", "registry.example.com:5000/a:1", "ubuntu"]
)
def test_private_image_from_elsewhere_is_refused_and_nothing_saved(catalog, world, reference):
    before = Image.objects.count()
    with pytest.raises(ServiceError) as raised:
        private_image(world.tenant, world.admin, reference=reference)
    assert raised.value.field == "reference"
    assert Image.objects.count() == before
    assert not AuditEvent.objects.filter(action="image.created").exists()


def test_public_images_may_come_from_any_registry(catalog, world):
    image = private_image(None, world.admin, reference="quay.io/acme/trainer:1")
    assert image.is_public


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"compatible_with": []}, "compatible_with"),
        ({"compatible_with": ["tpu"]}, "compatible_with"),
        ({"default_command": "python train.py"}, "default_command"),
        ({"default_command": ["python", 3]}, "default_command"),
        ({"ports": [{"name": "jupyter", "port": 70000}]}, "ports"),
        ({"ports": [{"port": 8888}]}, "ports"),
    ],
)
def test_image_fields_are_validated(catalog, world, fields, field):
    with pytest.raises(ServiceError) as raised:
        private_image(world.tenant, world.admin, **fields)
    assert raised.value.field == field
    assert not Image.objects.filter(tenant=world.tenant).exists()


def test_slugs_clash_within_a_tenant_only(catalog, world, other_world):
    private_image(world.tenant, world.admin)
    with pytest.raises(ServiceError) as raised:
        private_image(world.tenant, world.admin)
    assert raised.value.code == "conflict"
    # Another tenant's private image may share the slug; a public image's slug is
    # taken for everyone (a private twin would shadow it in the launch form).
    private_image(other_world.tenant, other_world.admin)
    with pytest.raises(ServiceError) as raised:
        private_image(world.tenant, world.admin, slug="ubuntu-22-04")
    assert raised.value.field == "slug"


def test_private_images_are_seen_by_their_tenant_only(catalog, world, other_world):
    image = private_image(world.tenant, world.admin)

    assert image in images_for_tenant(tenant=world.tenant)
    assert image not in images_for_tenant(tenant=other_world.tenant)
    assert image not in images_for_tenant(tenant=None)
    assert list(Image.objects.owned_by(world.tenant)) == [image]
    assert not Image.objects.owned_by(other_world.tenant).exists()
    assert not Image.objects.owned_by(None).exists()
    public = Image.objects.filter(tenant__isnull=True).count()
    assert images_for_tenant(tenant=other_world.tenant).count() == public


def test_image_deactivate_hides_it_and_is_audited_once(catalog, world):
    image = private_image(world.tenant, world.admin)

    services.image_deactivate(image=image, user=world.admin)
    services.image_deactivate(image=image, user=world.admin)

    assert image not in images_for_tenant(tenant=world.tenant)
    assert image in images_for_tenant(tenant=world.tenant, include_inactive=True)
    assert AuditEvent.objects.filter(action="image.deactivated").count() == 1


def test_image_filters(catalog, world):
    private_image(world.tenant, world.admin, framework="JAX", compatible_with=["amd"])

    def slugs(**filters):
        return set(images_for_tenant(tenant=world.tenant, **filters).values_list("slug", flat=True))

    assert slugs(query="jax") == {"trainer"}
    assert "pytorch-2-5-cuda12-4" in slugs(query="PyTorch")
    assert slugs(query="PyTorch") == demo_image_slugs(query="pytorch")
    assert slugs(kind="full_stack") == demo_image_slugs(kind="full_stack")
    assert {"ngc-pytorch-24-10", "hf-transformers-pytorch"} <= slugs(kind="full_stack")
    assert slugs(vendor="huawei") == demo_image_slugs(vendor="huawei")
    assert "mindspore-ascend-2-3" in slugs(vendor="huawei")
    assert slugs(vendor="amd") == demo_image_slugs(vendor="amd") | {"trainer"}
    assert {"rocm-6-2", "pytorch-rocm-6-2"} <= slugs(vendor="amd")
    assert "tensorflow-2-17-gpu" not in slugs(vendor="amd")
    assert slugs(kind="framework", vendor="amd", query="pytorch") == {"pytorch-rocm-6-2"}
