from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from console.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictDecimalField,
    StrictModelSerializer,
    StrictRegexField,
)
from console.crypto import mask
from marketplace.inventory import CPU_ARCHES, INTERCONNECTS
from marketplace.models import (
    GpuType,
    Image,
    ImageKind,
    NodePool,
    PriceVersion,
    Region,
    RegistryCredential,
    Tier,
)
from marketplace.pricing import MAX_NODES
from marketplace.recommend import DEFAULT_LORA_RANK, Precision, Workload
from marketplace.selectors import SORTS
from marketplace.services.catalog import LABEL_VALUE, NODE_POOL_EDITABLE_FIELDS
from marketplace.services.images import COMPATIBLE_VALUES


class GpuTypeSerializer(StrictModelSerializer):
    class Meta:
        model = GpuType
        fields = [
            "slug",
            "vendor",
            "model",
            "memory_gib",
            "architecture",
            "interconnect",
            "peak_tflops",
            "node_label_key",
            "node_label_value",
            "resource_name",
        ]


class RegionSerializer(StrictModelSerializer):
    class Meta:
        model = Region
        fields = ["slug", "name"]


class OfferSerializer(serializers.Serializer):
    gpu_type = StrictCharField(source="gpu_type.slug", allow_null=True, default=None)
    region = StrictCharField(source="region.slug")
    tier = StrictCharField()
    currency = StrictCharField()
    price_per_gpu_hour = serializers.SerializerMethodField()
    price_per_vcpu_hour = serializers.SerializerMethodField()
    available_gpus = serializers.SerializerMethodField()
    total_gpus = serializers.SerializerMethodField()
    available_vcpus = serializers.SerializerMethodField()
    memory_gib = serializers.IntegerField(allow_null=True)
    tflops = serializers.DecimalField(max_digits=8, decimal_places=1, allow_null=True)
    price_per_pflop_hour = serializers.DecimalField(
        max_digits=14, decimal_places=4, allow_null=True
    )
    vcpus_per_node = serializers.IntegerField()
    memory_gib_per_node = serializers.IntegerField()
    price_version = serializers.IntegerField()
    simulated = StrictBooleanField()
    isolated_runtime = StrictBooleanField(
        help_text="Every pool serving it runs pods in an isolated runtime (e.g. Kata, gVisor)"
    )
    interconnects = serializers.ListField(
        child=StrictCharField(),
        help_text="What every node serving it has: nvlink, rdma, infiniband (from node labels)",
    )
    cpu_arch = StrictCharField(
        help_text='The nodes\' CPU architecture (kubernetes.io/arch): amd64, arm64; "" if mixed'
    )

    def get_price_per_gpu_hour(self, offer) -> str | None:
        return None if offer.is_cpu else str(offer.unit_price)

    def get_price_per_vcpu_hour(self, offer) -> str | None:
        return str(offer.unit_price) if offer.is_cpu else None

    def get_available_gpus(self, offer) -> int:
        return 0 if offer.is_cpu else offer.available

    def get_total_gpus(self, offer) -> int:
        return 0 if offer.is_cpu else offer.total

    def get_available_vcpus(self, offer) -> int | None:
        return offer.available if offer.is_cpu else None


class OfferQuerySerializer(serializers.Serializer):
    """The offers list's filters (query parameters); empty text filters nothing."""

    gpu_type = StrictCharField(required=False, default="", allow_blank=True, max_length=40)
    vendor = StrictCharField(required=False, default="", allow_blank=True, max_length=40)
    region = StrictCharField(required=False, default="", allow_blank=True, max_length=40)
    tier = StrictCharField(required=False, default="", allow_blank=True, max_length=40)
    min_memory_gib = serializers.IntegerField(required=False, min_value=0, max_value=1_000_000)
    available = StrictBooleanField(default=False, help_text="Only offers with free GPUs")
    interconnect = serializers.ChoiceField(
        choices=list(INTERCONNECTS), required=False, help_text="Only offers whose nodes have it"
    )
    cpu_arch = serializers.ChoiceField(choices=list(CPU_ARCHES), required=False)
    sort = serializers.ChoiceField(choices=list(SORTS), default="price")
    include_cpu = StrictBooleanField(default=True)


class ImageQuerySerializer(serializers.Serializer):
    """The image list's filters (query parameters); empty filters nothing."""

    q = StrictCharField(
        required=False, default="", allow_blank=True, max_length=100, help_text="Search text"
    )
    kind = serializers.ChoiceField(choices=ImageKind.choices, required=False, default="")
    vendor = StrictCharField(required=False, default="", allow_blank=True, max_length=40)
    interactive = serializers.ChoiceField(
        choices=[("ssh", "SSH"), ("jupyter", "Jupyter")],
        required=False,
        default="",
        help_text="Only images that serve this themselves (marked with it or both)",
    )


def _decimal(value, places: str) -> str | None:
    """A Decimal as DRF's DecimalField writes it (fixed places, rounded half up)."""
    return None if value is None else str(Decimal(value).quantize(Decimal(places), ROUND_HALF_UP))


def offer_rows(offers) -> list[dict]:
    """The offers as `OfferSerializer` writes them, without its per-field machinery (the
    offers list's hot path); the serializer stays the schema, a test checks they agree."""
    return [
        {
            "gpu_type": offer.gpu_type.slug if offer.gpu_type is not None else None,
            "region": offer.region.slug,
            "tier": offer.tier,
            "currency": offer.currency,
            "price_per_gpu_hour": None if offer.is_cpu else str(offer.unit_price),
            "price_per_vcpu_hour": str(offer.unit_price) if offer.is_cpu else None,
            "available_gpus": 0 if offer.is_cpu else offer.available,
            "total_gpus": 0 if offer.is_cpu else offer.total,
            "available_vcpus": offer.available if offer.is_cpu else None,
            "memory_gib": offer.memory_gib,
            "tflops": _decimal(offer.tflops, "0.1"),
            "price_per_pflop_hour": _decimal(offer.price_per_pflop_hour, "0.0001"),
            "vcpus_per_node": offer.vcpus_per_node,
            "memory_gib_per_node": offer.memory_gib_per_node,
            "price_version": offer.price_version,
            "simulated": offer.simulated,
            "isolated_runtime": offer.isolated_runtime,
            "interconnects": list(offer.interconnects),
            "cpu_arch": offer.cpu_arch,
        }
        for offer in offers
    ]


class EstimateRequestSerializer(serializers.Serializer):
    gpu_type = serializers.SlugRelatedField(
        slug_field="slug",
        allow_null=True,
        required=False,
        default=None,
        queryset=GpuType.objects.filter(is_active=True),
    )
    gpus_per_node = serializers.IntegerField(min_value=0, max_value=64, default=0)
    cpus = serializers.IntegerField(min_value=1, max_value=1024, required=False)
    nodes = serializers.IntegerField(min_value=1, max_value=MAX_NODES)
    region = serializers.SlugRelatedField(
        slug_field="slug", queryset=Region.objects.filter(is_active=True)
    )
    spot_ratio = serializers.DecimalField(
        max_digits=6, decimal_places=4, min_value=Decimal(0), max_value=Decimal(1), default=0
    )
    hours = serializers.DecimalField(
        max_digits=10, decimal_places=2, min_value=Decimal("0.01"), default=Decimal(1)
    )
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.ON_DEMAND)
    reserved_months = serializers.ChoiceField(choices=[1, 3, 12], default=1)

    def validate(self, attrs):
        if attrs.get("gpu_type") is not None and attrs.get("gpus_per_node", 0) < 1:
            raise serializers.ValidationError(
                {"gpus_per_node": ["A GPU offer needs at least one GPU per node."]}
            )
        if attrs.get("gpu_type") is None and not attrs.get("cpus"):
            raise serializers.ValidationError(
                {"cpus": ["A CPU offer needs the number of vCPUs per node."]}
            )
        return attrs


class EstimateSerializer(serializers.Serializer):
    hourly = serializers.DecimalField(max_digits=18, decimal_places=2, coerce_to_string=True)
    # The split of whole nodes the estimate priced: the one a launch of it makes.
    spot_nodes = serializers.IntegerField()
    on_demand_nodes = serializers.IntegerField()
    split = StrictCharField(source="split.label", help_text='e.g. "6 spot + 2 on-demand nodes"')
    split_note = StrictCharField(
        source="split.note",
        allow_blank=True,
        help_text="Why the split isn't the spot ratio asked (whole nodes); empty when it is",
    )
    total = serializers.DecimalField(max_digits=18, decimal_places=2, coerce_to_string=True)
    currency = StrictCharField()
    spot_share = serializers.DecimalField(max_digits=18, decimal_places=2, coerce_to_string=True)
    on_demand_share = serializers.DecimalField(
        max_digits=18, decimal_places=2, coerce_to_string=True
    )
    price_version = serializers.IntegerField()
    units = serializers.IntegerField()
    unit = StrictCharField()
    unit_price_spot = serializers.DecimalField(
        max_digits=18, decimal_places=6, coerce_to_string=True
    )
    unit_price_base = serializers.DecimalField(
        max_digits=18, decimal_places=6, coerce_to_string=True
    )
    tenant_discount_percent = serializers.DecimalField(
        max_digits=5, decimal_places=2, coerce_to_string=True
    )


class ImageSerializer(StrictModelSerializer):
    # Catalog slugs may hold dots ("python-3.11"); new ones follow ImageCreateSerializer.
    slug = StrictCharField(max_length=80)
    public = StrictBooleanField(source="is_public", read_only=True)

    class Meta:
        model = Image
        fields = [
            "id",
            "slug",
            "name",
            "reference",
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
            "public",
            "is_active",
        ]
        read_only_fields = ["id", "public", "is_active"]


class PortSerializer(serializers.Serializer):
    name = StrictCharField(max_length=40)
    port = serializers.IntegerField(min_value=1, max_value=65535)


class ImageCreateSerializer(ImageSerializer):
    """A new private image, its lists typed as the service checks them. The slug is
    slugified by the service, so it needs a letter or digit (one of only dashes and
    underscores would come out empty)."""

    slug = StrictRegexField(r"^[-a-zA-Z0-9_]*[a-zA-Z0-9][-a-zA-Z0-9_]*\Z", max_length=80)
    compatible_with = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(COMPATIBLE_VALUES)), allow_empty=False
    )
    default_command = serializers.ListField(
        child=StrictCharField(allow_blank=True, trim_whitespace=False),
        required=False,
        default=list,
    )
    ports = PortSerializer(many=True, required=False, default=list)


class NodePoolSerializer(StrictModelSerializer):
    node_selector = serializers.DictField(
        child=StrictRegexField(LABEL_VALUE, max_length=63, allow_blank=True),
        required=False,
        help_text="Node labels the pool's pods must match (Kubernetes label syntax, checked "
        "by the pool service).",
    )
    region = StrictCharField(source="region.slug", read_only=True)
    gpu_type = StrictCharField(source="gpu_type.slug", read_only=True, allow_null=True)
    available_gpus = serializers.IntegerField(read_only=True)
    preemption_threshold = StrictDecimalField(
        max_digits=3,
        decimal_places=2,
        min_value=Decimal(0),
        max_value=Decimal(1),
        required=False,
        help_text=NodePool._meta.get_field("preemption_threshold").help_text,
    )
    memory_margin = StrictDecimalField(
        max_digits=3,
        decimal_places=2,
        min_value=Decimal(0),
        max_value=Decimal(1),
        required=False,
        help_text=NodePool._meta.get_field("memory_margin").help_text,
    )
    locality_weight = StrictDecimalField(
        max_digits=4,
        decimal_places=2,
        min_value=Decimal(1),
        max_value=Decimal(10),
        required=False,
        help_text=NodePool._meta.get_field("locality_weight").help_text,
    )
    topology_label = StrictCharField(
        max_length=100,
        required=False,
        help_text=NodePool._meta.get_field("topology_label").help_text,
    )
    interconnects = serializers.ListField(child=StrictCharField(), read_only=True)
    topology_blocks = serializers.DictField(
        child=serializers.DictField(child=serializers.IntegerField()),
        read_only=True,
        help_text="Per block at the last sync: its usable nodes and how many are idle.",
    )

    class Meta:
        model = NodePool
        fields = [
            "id",
            "slug",
            "name",
            "region",
            "backend",
            "tier",
            "gpu_type",
            "node_selector",
            "node_count",
            "gpus_per_node",
            "total_gpus",
            "allocatable_gpus",
            "in_use_gpus",
            "available_gpus",
            "vcpus_per_node",
            "memory_gib_per_node",
            "last_synced_at",
            "is_active",
            "preemption_threshold",
            "preempt_other_tenants_spot",
            "memory_margin",
            "runtime_class_name",
            "locality_weight",
            "interconnects",
            "cpu_arch",
            "gpu_memory_gib",
            "topology_label",
            "topology_blocks",
        ]
        read_only_fields = [f for f in fields if f not in NODE_POOL_EDITABLE_FIELDS]


class PriceEntryInSerializer(serializers.Serializer):
    gpu_type = serializers.SlugRelatedField(
        slug_field="slug", queryset=GpuType.objects.all(), allow_null=True
    )
    region = serializers.SlugRelatedField(slug_field="slug", queryset=Region.objects.all())
    on_demand_price = serializers.DecimalField(
        max_digits=14, decimal_places=6, min_value=Decimal("0.000001")
    )


class PriceVersionSerializer(StrictModelSerializer):
    entries = serializers.SerializerMethodField()

    class Meta:
        model = PriceVersion
        fields = [
            "id",
            "currency",
            "effective_from",
            "spot_discount_percent",
            "reserved_1m_discount_percent",
            "reserved_3m_discount_percent",
            "reserved_12m_discount_percent",
            "note",
            "created_at",
            "entries",
        ]

    def get_entries(self, version) -> list[dict]:
        return [
            {
                "gpu_type": e.gpu_type.slug if e.gpu_type else None,
                "region": e.region.slug,
                "on_demand_price": str(e.on_demand_price),
            }
            for e in version.entries.all()
        ]


class PriceVersionInSerializer(serializers.Serializer):
    effective_from = serializers.DateTimeField()
    currency = StrictCharField(max_length=3, default="USD")
    spot_discount_percent = serializers.DecimalField(max_digits=5, decimal_places=2)
    reserved_1m_discount_percent = serializers.DecimalField(max_digits=5, decimal_places=2)
    reserved_3m_discount_percent = serializers.DecimalField(max_digits=5, decimal_places=2)
    reserved_12m_discount_percent = serializers.DecimalField(max_digits=5, decimal_places=2)
    note = StrictCharField(max_length=200, required=False, default="", allow_blank=True)
    entries = PriceEntryInSerializer(many=True, allow_empty=False)


class RegistryCredentialSerializer(StrictModelSerializer):
    """A registry login; the password is write-only and always answered masked."""

    password = StrictCharField(write_only=True, max_length=4000, trim_whitespace=False)

    class Meta:
        model = RegistryCredential
        fields = ["id", "registry", "username", "password", "updated_at"]
        read_only_fields = ["id", "updated_at"]

    def to_representation(self, credential):
        data = super().to_representation(credential)
        data["password"] = mask("stored")
        return data


class RecommendationRequestSerializer(serializers.Serializer):
    """What the GPU recommender needs: the model's size, what to do with it, at which
    precision, and how many tokens at once. The shape fields are optional: derived from
    the parameter count when absent (marketplace.recommend.model_shape)."""

    parameters_billion = serializers.DecimalField(
        max_digits=9,
        decimal_places=3,
        min_value=Decimal("0.001"),
        max_value=Decimal(10_000),
        help_text="Model size in billions of parameters (7 for a 7B model).",
    )
    workload = serializers.ChoiceField(choices=[(w.value, w.label) for w in Workload])
    precision = serializers.ChoiceField(choices=[p.value for p in Precision])
    sequence_length = serializers.IntegerField(min_value=1, max_value=1_048_576, default=2048)
    batch_size = serializers.IntegerField(min_value=1, max_value=4096, default=1)
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.ON_DEMAND)
    region = serializers.SlugRelatedField(
        slug_field="slug",
        queryset=Region.objects.filter(is_active=True),
        required=False,
        allow_null=True,
        default=None,
        help_text="Only options in this region (all the caller may use by default).",
    )
    layers = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    hidden_size = serializers.IntegerField(min_value=64, max_value=131_072, required=False)
    kv_heads = serializers.IntegerField(
        min_value=1, max_value=1024, required=False, help_text="Fewer than heads for GQA models."
    )
    head_dim = serializers.IntegerField(min_value=16, max_value=1024, required=False)
    lora_rank = serializers.IntegerField(min_value=1, max_value=1024, default=DEFAULT_LORA_RANK)


class MemoryBreakdownSerializer(serializers.Serializer):
    weights = serializers.FloatField(help_text="GiB")
    gradients = serializers.FloatField(help_text="GiB")
    optimizer = serializers.FloatField(help_text="GiB")
    activations = serializers.FloatField(help_text="GiB")
    kv_cache = serializers.FloatField(help_text="GiB")


class ModelShapeSerializer(serializers.Serializer):
    parameters = serializers.IntegerField()
    layers = serializers.IntegerField()
    hidden_size = serializers.IntegerField()
    heads = serializers.IntegerField()
    kv_heads = serializers.IntegerField()
    head_dim = serializers.IntegerField()
    ffn_size = serializers.IntegerField()
    vocabulary = serializers.IntegerField()


class GpuOptionSerializer(serializers.Serializer):
    gpu_type = StrictCharField(source="gpu_type.slug")
    gpu_model = StrictCharField(source="gpu_type.model")
    gpu_memory_gib = serializers.IntegerField(source="gpu_type.memory_gib")
    region = StrictCharField(source="region.slug")
    tier = StrictCharField()
    gpus = serializers.IntegerField(help_text="GPUs in all")
    gpus_per_node = serializers.IntegerField()
    nodes = serializers.IntegerField()
    fits = StrictBooleanField(help_text="The pools here have enough nodes for it")
    # Wide: an absurd (but valid) model on small cards asks for billions of GPUs.
    price_per_hour = serializers.DecimalField(
        max_digits=32, decimal_places=2, coerce_to_string=True
    )
    currency = StrictCharField()
    available_now = StrictBooleanField(help_text="Enough GPUs are free right now")
    free_gpus = serializers.IntegerField()
    memory_per_gpu_gib = serializers.FloatField()


class RecommendationSerializer(serializers.Serializer):
    memory_needed_gib = serializers.FloatField(help_text="Before the margin")
    memory_margin = serializers.FloatField(help_text="Share of GPU memory kept in reserve")
    memory_with_margin_gib = serializers.FloatField()
    breakdown = serializers.SerializerMethodField()
    model = ModelShapeSerializer(source="shape")
    options = GpuOptionSerializer(many=True)

    @extend_schema_field(MemoryBreakdownSerializer)
    def get_breakdown(self, recommendation) -> dict[str, float]:
        return recommendation.breakdown.gib()
