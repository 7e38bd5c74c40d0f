from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import factory
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from django.utils import timezone
from django.utils.text import slugify

from billing.models import Budget, BudgetAction
from console.models import (
    AuditEvent,
    Invitation,
    Membership,
    SshPublicKey,
    Tenant,
    User,
    sha256_hex,
)
from console.permissions import Role
from console.ssh_public_keys import ParsedPublicKey, parse_public_key
from jobs.models import Job, JobStatus
from marketplace.models import (
    Backend,
    GpuType,
    Image,
    ImageKind,
    NodePool,
    PriceEntry,
    PriceVersion,
    Region,
    Tier,
    Vendor,
)
from storage.models import Volume

DEFAULT_PASSWORD = "correct-horse-battery-42"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = User
        django_get_or_create = ("email",)
        skip_postgeneration_save = True

    email = factory.Sequence(lambda n: f"user{n}@example.test")
    full_name = factory.Faker("name")
    password = factory.PostGenerationMethodCall("set_password", DEFAULT_PASSWORD)

    @factory.post_generation
    def _save(obj, create, extracted, **kwargs):
        if create:
            obj.save()


class TenantFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Tenant

    name = factory.Sequence(lambda n: f"Tenant {n}")
    slug = factory.Sequence(lambda n: f"tenant-{n}")


class MembershipFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Membership

    tenant = factory.SubFactory(TenantFactory)
    user = factory.SubFactory(UserFactory)
    role = Role.MEMBER


class InvitationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Invitation

    tenant = factory.SubFactory(TenantFactory)
    email = factory.Sequence(lambda n: f"invitee{n}@example.test")
    role = Role.MEMBER
    token_hash = factory.Sequence(lambda n: sha256_hex(f"invitation-token-{n}"))
    expires_at = factory.LazyFunction(lambda: timezone.now() + timezone.timedelta(days=7))


class AuditEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AuditEvent

    tenant = factory.SubFactory(TenantFactory)
    actor_label = "someone@example.test"
    action = "test.event"


def ed25519_public_key_line(comment: str = "") -> str:
    """A fresh Ed25519 public key as one .pub line (made by `cryptography`)."""
    line = (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    return f"{line} {comment}".strip()


class SshPublicKeyFactory(factory.django.DjangoModelFactory):
    """A real, fresh Ed25519 key, its fields as the parser reads them."""

    class Meta:
        model = SshPublicKey
        exclude = ("parsed",)

    user = factory.SubFactory(UserFactory)
    parsed: ParsedPublicKey = factory.LazyFunction(
        lambda: parse_public_key(ed25519_public_key_line("factory@test"))
    )
    title = factory.Sequence(lambda n: f"laptop {n}")
    key_type = factory.LazyAttribute(lambda o: o.parsed.key_type)
    bits = factory.LazyAttribute(lambda o: o.parsed.bits)
    public_key = factory.LazyAttribute(lambda o: o.parsed.public_key)
    comment = factory.LazyAttribute(lambda o: o.parsed.comment)
    fingerprint = factory.LazyAttribute(lambda o: o.parsed.fingerprint)


# --------------------------------------------------------------------------- catalog
# Slugs are get-or-create keys, so a factory reuses a row the demo catalog (the `catalog`
# fixture) already holds: JobFactory() lands on the seeded local CPU pool when it exists.


class RegionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Region
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"region-{n}")
    name = factory.LazyAttribute(lambda o: o.slug.replace("-", " ").title())


class GpuTypeFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = GpuType
        django_get_or_create = ("slug",)

    slug = factory.Sequence(lambda n: f"gpu-{n}")
    vendor = Vendor.NVIDIA
    model = factory.LazyAttribute(lambda o: f"Test GPU {o.slug}")
    memory_gib = 80
    architecture = "Hopper"
    peak_tflops = Decimal("989.4")
    node_label_value = factory.LazyAttribute(lambda o: f"NVIDIA-{o.slug.upper()}")
    nvml_names = factory.LazyAttribute(lambda o: [o.model])


def pool_slug(backend: str, region: Region, gpu_type: GpuType | None, tier: str) -> str:
    """The slug capacity_sync gives a pool (marketplace.services)."""
    gpu = gpu_type.slug if gpu_type else "cpu"
    return slugify(f"{backend}-{region.slug}-{gpu}-{tier}").replace("_", "-")


class NodePoolFactory(factory.django.DjangoModelFactory):
    """A pool with capacity set directly (what a capacity sync would write)."""

    class Meta:
        model = NodePool
        django_get_or_create = ("slug",)

    region = factory.SubFactory(RegionFactory, slug="local")
    backend = Backend.LOCAL
    tier = Tier.ON_DEMAND
    gpu_type = None
    slug = factory.LazyAttribute(lambda o: pool_slug(o.backend, o.region, o.gpu_type, o.tier))
    name = factory.LazyAttribute(lambda o: o.slug)
    node_count = 1
    gpus_per_node = factory.LazyAttribute(lambda o: 8 if o.gpu_type else 0)
    total_gpus = factory.LazyAttribute(lambda o: o.node_count * o.gpus_per_node)
    allocatable_gpus = factory.SelfAttribute("total_gpus")
    vcpus_per_node = 16
    memory_gib_per_node = 64
    allocatable_vcpus = factory.LazyAttribute(lambda o: o.node_count * o.vcpus_per_node)
    last_synced_at = factory.LazyFunction(timezone.now)


class PriceVersionFactory(factory.django.DjangoModelFactory):
    """A price book edition in force (the demo catalog's discounts); add prices with
    PriceEntryFactory(version=...)."""

    class Meta:
        model = PriceVersion

    effective_from = factory.LazyFunction(lambda: timezone.now() - timedelta(days=90))
    spot_discount_percent = Decimal(55)
    reserved_1m_discount_percent = Decimal(15)
    reserved_3m_discount_percent = Decimal(25)
    reserved_12m_discount_percent = Decimal(40)


class PriceEntryFactory(factory.django.DjangoModelFactory):
    """An on-demand price: per GPU-hour, or per vCPU-hour when gpu_type is None."""

    class Meta:
        model = PriceEntry

    version = factory.SubFactory(PriceVersionFactory)
    region = factory.SubFactory(RegionFactory, slug="local")
    gpu_type = None
    on_demand_price = factory.LazyAttribute(
        lambda o: Decimal("2.500000") if o.gpu_type else Decimal("0.012500")
    )


class ImageFactory(factory.django.DjangoModelFactory):
    """A public image by default (tenant None); the contract's CPU image is python-3.11."""

    class Meta:
        model = Image
        django_get_or_create = ("slug", "tenant")

    slug = factory.Sequence(lambda n: f"image-{n}")
    tenant = None
    name = factory.LazyAttribute(lambda o: o.slug)
    reference = factory.LazyAttribute(lambda o: f"registry.example.test/{o.slug}:latest")
    kind = ImageKind.BASE
    compatible_with = factory.LazyFunction(lambda: ["cpu", "nvidia"])


class BudgetFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Budget

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"Budget {n}")
    amount = Decimal("100")
    thresholds = factory.LazyFunction(lambda: [50, 80, 100])
    action = BudgetAction.PAUSE_NON_CRITICAL


# --------------------------------------------------------------------------- jobs


class JobFactory(factory.django.DjangoModelFactory):
    """A queued job placed on one pool (by default the local CPU pool, one node, on-demand).

    It always starts queued: reach any other status through the state machine
    (tests.jobs_helpers.advance / advance_to), never by writing status or events."""

    class Meta:
        model = Job

    tenant = factory.SubFactory(TenantFactory)
    created_by = None
    name = factory.Sequence(lambda n: f"job-{n}")
    image = factory.SubFactory(
        ImageFactory, slug="python-3.11", reference="python:3.11", compatible_with=["cpu"]
    )
    image_reference = factory.SelfAttribute("image.reference")
    command = factory.LazyFunction(lambda: ["python", "-c", "print(1)"])
    pool = factory.SubFactory(NodePoolFactory)
    region = factory.SelfAttribute("pool.region")
    backend = factory.SelfAttribute("pool.backend")
    gpu_type = factory.SelfAttribute("pool.gpu_type")
    gpus_per_node = factory.LazyAttribute(lambda o: o.pool.gpus_per_node if o.gpu_type else 0)
    cpus = 1
    nodes = 1
    spot_nodes = 0
    on_demand_nodes = factory.LazyAttribute(lambda o: o.nodes - o.spot_nodes)

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        status = kwargs.get("status", JobStatus.QUEUED)
        if status != JobStatus.QUEUED:
            raise ValueError(
                f"JobFactory makes queued jobs; reach {status!r} through the state machine"
            )
        return super()._create(model_class, *args, **kwargs)


# --------------------------------------------------------------------------- storage


class VolumeFactory(factory.django.DjangoModelFactory):
    """An existing volume (10 GiB, single writer) in the "local" region by default."""

    class Meta:
        model = Volume

    tenant = factory.SubFactory(TenantFactory)
    name = factory.Sequence(lambda n: f"vol-{n}")
    size_gib = 10
    region = factory.SubFactory(RegionFactory, slug="local")
