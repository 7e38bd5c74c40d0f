"""Images and where they may come from: the registry allow-list, public and private
images, and tenants' registry logins (stored encrypted; removing one tells the backends
to drop their copies). Every change is audit-logged in the same transaction.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q
from django.http import HttpRequest
from django.utils.text import slugify

from console.crypto import encrypt_json
from console.models import Tenant, User
from console.service_errors import ErrorCode, ServiceError
from console.services.audit import audit_record
from marketplace.images import InvalidReference, is_allowed, parse_reference
from marketplace.models import AllowedRegistry, Image, ImageInteractive, RegistryCredential
from marketplace.signals import registry_credential_removed

# --- registry allow-list ----


@transaction.atomic
def allowed_registry_add(
    *,
    host: str,
    path_prefix: str = "",
    note: str = "",
    user: User,
    request: HttpRequest | None = None,
) -> AllowedRegistry:
    """Allow private images from a registry (optionally one path prefix). Adding one that
    is allowed already changes nothing and is not audited again."""
    host = (host or "").strip().lower()
    if not host:
        raise ServiceError("Give a registry host.", field="host")
    registry, created = AllowedRegistry.objects.get_or_create(
        host=host, path_prefix=(path_prefix or "").strip("/"), defaults={"note": note}
    )
    if created:
        audit_record(action="registry.allowed", actor=user, target=registry, request=request)
    return registry


@transaction.atomic
def allowed_registry_remove(
    *, registry: AllowedRegistry, user: User, request: HttpRequest | None = None
) -> None:
    """Take a registry off the allow-list. Images already created from it stay."""
    audit_record(action="registry.removed", actor=user, target=registry, request=request)
    registry.delete()


# --- images ----


def _allowed_registries() -> list[tuple[str, str]]:
    return list(AllowedRegistry.objects.values_list("host", "path_prefix"))


# --- images ----


def image_validate_reference(*, reference: str, tenant: Tenant | None) -> str:
    """The normalised reference, or a ServiceError. Private images must come from an
    allow-listed registry."""
    try:
        parsed = parse_reference(reference)
    except InvalidReference as error:
        raise ServiceError(str(error), field="reference") from None
    if tenant is not None and not is_allowed(parsed, _allowed_registries()):
        raise ServiceError(
            f"Registry {parsed.registry} (path {parsed.path}) is not on the "
            "allow-list for private images; ask platform staff to add it.",
            field="reference",
        )
    return str(parsed)


IMAGE_FIELDS = (
    "name",
    "kind",
    "cuda_version",
    "rocm_version",
    "framework",
    "framework_version",
    "compatible_with",
    "size_gib",
    "description",
    "default_command",
    "ports",
    "interactive",
)
COMPATIBLE_VALUES = {"nvidia", "amd", "huawei", "cpu"}


def _validate_image_fields(fields: dict[str, Any]) -> None:
    if fields.get("interactive", "") not in ImageInteractive.values:
        raise ServiceError(
            "interactive is ssh, jupyter, both, or empty for a batch image.", field="interactive"
        )
    compatible = fields.get("compatible_with") or []
    if not compatible or not set(compatible) <= COMPATIBLE_VALUES:
        raise ServiceError(
            "Say which hardware it runs on: nvidia, amd, huawei and/or cpu.",
            field="compatible_with",
        )
    command = fields.get("default_command") or []
    if not isinstance(command, list) or not all(isinstance(a, str) for a in command):
        raise ServiceError(
            "The default command is a list of strings (no shell string).", field="default_command"
        )
    for port in fields.get("ports") or []:
        if (
            not isinstance(port, dict)
            or not str(port.get("name", "")).strip()
            or not isinstance(port.get("port"), int)
            or not 1 <= port["port"] <= 65535
        ):
            raise ServiceError(
                'Ports look like [{"name": "jupyter", "port": 8888}].', field="ports"
            )


@transaction.atomic
def image_create(
    *,
    tenant: Tenant | None,
    slug: str,
    reference: str,
    user: User,
    request: HttpRequest | None = None,
    **fields: Any,
) -> Image:
    """A public image (tenant None, staff) or a tenant's private image."""
    unknown = set(fields) - set(IMAGE_FIELDS)
    if unknown:
        raise ServiceError(f"Unknown image fields: {', '.join(sorted(unknown))}.")
    slug = slugify(slug)
    if not slug:
        raise ServiceError("Give the image a slug.", field="slug")
    _validate_image_fields(fields)
    normalised = image_validate_reference(reference=reference, tenant=tenant)
    # A private image may not shadow a public one either (launches name images by slug).
    if Image.objects.filter(Q(tenant=tenant) | Q(tenant__isnull=True), slug=slug).exists():
        raise ServiceError(
            f"An image with slug “{slug}” exists already.", code=ErrorCode.CONFLICT, field="slug"
        )
    image = Image.objects.create(tenant=tenant, slug=slug, reference=normalised, **fields)
    audit_record(
        action="image.created",
        tenant=tenant,
        actor=user,
        target=image,
        request=request,
        metadata={"reference": normalised, "public": tenant is None},
    )
    return image


@transaction.atomic
def image_deactivate(*, image: Image, user: User, request: HttpRequest | None = None) -> Image:
    if image.is_active:
        image.is_active = False
        image.save(update_fields=["is_active"])
        audit_record(
            action="image.deactivated",
            tenant=image.tenant,
            actor=user,
            target=image,
            request=request,
        )
    return image


# --- registry credentials ----


def registry_normalise(registry: str) -> str:
    """host[:port] as image references name it (lower-case; docker.io for Docker Hub)."""
    text = (registry or "").strip().lower().removeprefix("https://").removeprefix("http://")
    text = text.rstrip("/")
    if text in ("index.docker.io", "registry-1.docker.io"):
        return "docker.io"
    return text


@transaction.atomic
def registry_credential_set(
    *,
    tenant: Tenant,
    user: User,
    registry: str,
    username: str,
    password: str,
    request: HttpRequest | None = None,
) -> RegistryCredential:
    """Store (or replace) the tenant's login to an allow-listed registry. The password is
    encrypted at once and never shown again; jobs started later pull with it."""
    host = registry_normalise(registry)
    if not host or host not in {h.lower() for h, _ in _allowed_registries()}:
        raise ServiceError(
            f"{host or 'That'} is not an allow-listed registry for private images.",
            field="registry",
        )
    username = (username or "").strip()
    if not username or len(username) > 200:
        raise ServiceError("Give the registry user name (up to 200 characters).", field="username")
    if not password:
        raise ServiceError("Give the password or access token.", field="password")
    credential, created = RegistryCredential.objects.update_or_create(
        tenant=tenant,
        registry=host,
        defaults={
            "username": username,
            "password_encrypted": encrypt_json({"password": password}),
            "created_by": user,
        },
    )
    audit_record(
        action="registry_credential.created" if created else "registry_credential.updated",
        tenant=tenant,
        actor=user,
        target=credential,
        request=request,
        metadata={"registry": host, "username": username},
    )
    return credential


@transaction.atomic
def registry_credential_delete(
    *, credential: RegistryCredential, user: User, request: HttpRequest | None = None
) -> None:
    audit_record(
        action="registry_credential.deleted",
        tenant=credential.tenant,
        actor=user,
        target=credential,
        request=request,
        metadata={"registry": credential.registry},
    )
    tenant_id, registry = credential.tenant_id, credential.registry
    credential.delete()
    # The backends' copies of the login go too (jobs listens, and removes them after
    # commit, by a task).
    registry_credential_removed.send(
        sender=RegistryCredential, tenant_id=tenant_id, registry=registry
    )
