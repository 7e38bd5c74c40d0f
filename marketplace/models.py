"""The catalog users browse before launching: GPU types, regions, node pools with their
capacity, the dated price book, tenant overrides and quotas, and the image catalog."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from console.tenancy import TenantOwnedModel, TenantScopedQuerySet

# Prices carry 6 decimals (4+ required); amounts are rounded to the cent only on invoices.
PRICE_DIGITS = 14
PRICE_PLACES = 6
PERCENT = {
    "max_digits": 5,
    "decimal_places": 2,
    "validators": [MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(100))],
}


class Vendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    AMD = "amd", "AMD"
    HUAWEI = "huawei", "Huawei"


class Tier(models.TextChoices):
    ON_DEMAND = "on_demand", "On-demand"
    SPOT = "spot", "Spot"
    RESERVED = "reserved", "Reserved"


class Backend(models.TextChoices):
    LOCAL = "local", "Local host"
    KUBERNETES = "kubernetes", "Kubernetes"


class GpuType(models.Model):
    slug = models.SlugField(max_length=40, unique=True)
    vendor = models.CharField(max_length=16, choices=Vendor.choices)
    model = models.CharField(max_length=80, help_text="Marketing name, e.g. H100 80GB SXM")
    memory_gib = models.PositiveIntegerField()
    architecture = models.CharField(max_length=40)
    interconnect = models.CharField(max_length=60, blank=True)
    # Peak dense FP16/BF16 tensor throughput, for $/PFLOP-hour comparisons.
    peak_tflops = models.DecimalField(max_digits=8, decimal_places=1)
    # How Kubernetes identifies it: the node label value and the extended resource.
    node_label_key = models.CharField(max_length=80, default="nvidia.com/gpu.product")
    node_label_value = models.CharField(max_length=120)
    resource_name = models.CharField(max_length=60, default="nvidia.com/gpu")
    # Substrings of the name NVML reports, to recognise local GPUs (e.g. "H100 80GB").
    nvml_names = models.JSONField(default=list, blank=True)
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["vendor", "-peak_tflops"]

    def __str__(self) -> str:
        return f"{self.get_vendor_display()} {self.model}"


class Region(models.Model):
    slug = models.SlugField(max_length=40, unique=True)
    name = models.CharField(max_length=80)
    is_active = models.BooleanField(default=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


def free_capacity(allocatable: int, in_use: int) -> int:
    """What a pool can still give: a node going unschedulable can leave more in use."""
    return max(0, allocatable - in_use)


class NodePool(models.Model):
    """A group of like nodes: one backend, region, tier and GPU type (none: CPU-only).

    Capacity fields are written only by the capacity sync from the backend's inventory.
    """

    slug = models.SlugField(max_length=80, unique=True)
    name = models.CharField(max_length=120)
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="pools")
    backend = models.CharField(max_length=16, choices=Backend.choices)
    tier = models.CharField(max_length=16, choices=Tier.choices, default=Tier.ON_DEMAND)
    gpu_type = models.ForeignKey(
        GpuType, null=True, blank=True, on_delete=models.PROTECT, related_name="pools"
    )
    # Extra node labels that select this pool's nodes (besides GPU product and region).
    node_selector = models.JSONField(default=dict, blank=True)
    node_count = models.PositiveIntegerField(default=0)
    gpus_per_node = models.PositiveIntegerField(default=0)
    total_gpus = models.PositiveIntegerField(default=0)
    allocatable_gpus = models.PositiveIntegerField(default=0)
    in_use_gpus = models.PositiveIntegerField(default=0)
    vcpus_per_node = models.PositiveIntegerField(default=0)
    memory_gib_per_node = models.PositiveIntegerField(default=0)
    allocatable_vcpus = models.PositiveIntegerField(default=0)
    in_use_vcpus = models.PositiveIntegerField(default=0)
    last_synced_at = models.DateTimeField(null=True, blank=True)
    is_active = models.BooleanField(default=True)
    # Its nodes are the console's own machine: only tenants staff allow to run on the
    # host may see or use it (set by capacity sync from the backend's capability).
    on_console_host = models.BooleanField(default=False)
    # Its nodes are simulated (the sandbox cluster; set by capacity sync): offers and
    # jobs on it carry a "simulated" badge.
    simulated = models.BooleanField(default=False)
    # Preemption knobs (jobs.services.admission): set by staff, shown on the pool page.
    preemption_threshold = models.DecimalField(
        max_digits=3,
        decimal_places=2,
        default=Decimal("0.80"),
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))],
        help_text=(
            "Preemption happens in this pool only while the share of its capacity that "
            "running jobs hold is at least this (0.80: 80 % in use; 0: whenever a job "
            "can't fit; 1: only when the pool is full). A queued job that doesn't fit "
            "may then stop lower-priority jobs of its own organisation, which are "
            "requeued and resume from their latest checkpoint."
        ),
    )
    memory_margin = models.DecimalField(
        max_digits=3,
        decimal_places=2,
        default=Decimal("0.20"),
        validators=[MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(1))],
        help_text=(
            "Share of each GPU's memory kept in reserve: a job that declares the GPU "
            "memory it needs (gpu_memory_gib) runs here only if that need plus this margin "
            "fits one GPU (0.20: need × 1.2; 0: the whole GPU)."
        ),
    )
    preempt_other_tenants_spot = models.BooleanField(
        default=False,
        help_text=(
            "Also let a job that doesn't fit stop lower-priority spot-only jobs of other "
            "organisations here (only when its own organisation's can't free enough). "
            "On-demand jobs of other organisations are never preempted."
        ),
    )
    # Isolation per pool: the Kubernetes RuntimeClass of its pods (a sandboxed runtime
    # such as Kata Containers or gVisor; the Pod Security settings stay as they are).
    runtime_class_name = models.CharField(
        "isolated runtime",
        max_length=63,
        blank=True,
        help_text=(
            "Kubernetes RuntimeClass for the pods of jobs in this pool, e.g. kata or "
            "gvisor (it must exist on the cluster). Offers served only by pools with one "
            'say "isolated runtime". Empty: the nodes\' default runtime.'
        ),
    )

    locality_weight = models.DecimalField(
        max_digits=4,
        decimal_places=2,
        default=Decimal("1.50"),
        validators=[MinValueValidator(Decimal(1)), MaxValueValidator(Decimal(10))],
        help_text=(
            "Weight of data locality against price when a job may run in several pools: "
            "in the region of its data this pool's price counts divided by this weight "
            "(1.50: a pool here wins unless another costs less than two thirds of it; "
            "1: price alone)."
        ),
    )
    # Read from its nodes' labels by capacity sync (what the nodes have in common).
    interconnects = models.JSONField(default=list, blank=True)  # nvlink, rdma, infiniband
    cpu_arch = models.CharField(max_length=16, blank=True)  # kubernetes.io/arch: amd64, arm64
    gpu_memory_gib = models.PositiveIntegerField(default=0)  # per GPU; 0: the GPU type's
    # Topology: a gang over TOPOLOGY_BLOCK_NODES nodes runs inside one block, the nodes
    # sharing this label's value (a zone, rack or block label staff name).
    topology_label = models.CharField(
        max_length=100,
        default="topology.kubernetes.io/zone",
        help_text=(
            "Node label whose value names a topology block (a zone, rack or NVLink/"
            "InfiniBand domain). A multi-node job larger than TOPOLOGY_BLOCK_NODES nodes "
            "runs inside one block or waits for one with enough free nodes."
        ),
    )
    # Per block at the last sync: {"block": {"nodes": usable nodes, "idle": of them with
    # no GPU in use}} (capacity sync).
    topology_blocks = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["region__slug", "gpu_type__slug", "tier"]

    def __str__(self) -> str:
        return self.name

    @property
    def available_gpus(self) -> int:
        return free_capacity(self.allocatable_gpus, self.in_use_gpus)

    @property
    def available_vcpus(self) -> int:
        return free_capacity(self.allocatable_vcpus, self.in_use_vcpus)

    def gpu_memory_refusal(self, need_gib: int | None) -> str:
        """Why a job needing `need_gib` of memory per GPU can't run in this pool with its
        `memory_margin` kept in reserve ("" when it can, or declares no need). The one
        place of the rule: launch refuses with it, admission holds a queued job with it
        when staff raised the margin since."""
        if not need_gib or self.gpu_type is None:
            return ""
        with_margin = Decimal(need_gib) * (1 + self.memory_margin)
        if with_margin <= self.memory_per_gpu_gib:
            return ""
        return (
            f"{need_gib} GiB per GPU with {self.name}'s {self.memory_margin:.0%} memory margin "
            f"is {with_margin.normalize():f} GiB; its {self.gpu_type.model} GPUs have "
            f"{self.memory_per_gpu_gib} GiB each."
        )

    def requirement_refusal(self, requirements: dict[str, str]) -> str:
        """Why this pool's nodes lack what a job requires ("" when they have it): the one
        place of the rule. `requirements`: {"interconnect": "nvlink"|"rdma"|"infiniband",
        "cpu_arch": "amd64"|"arm64"}, either optional."""
        interconnect = requirements.get("interconnect")
        if interconnect and interconnect not in self.interconnects:
            have = ", ".join(self.interconnects) or "none"
            return f"{self.name} has no {interconnect} interconnect (it has {have})."
        arch = requirements.get("cpu_arch")
        if arch and arch != self.cpu_arch:
            have = self.cpu_arch or "of unknown architecture"
            return f"{self.name}'s nodes are {have}, not {arch}."
        return ""

    @property
    def memory_per_gpu_gib(self) -> int:
        """What its nodes report (GPU feature discovery's label), else the GPU type's."""
        if self.gpu_memory_gib:
            return self.gpu_memory_gib
        return self.gpu_type.memory_gib if self.gpu_type else 0


class PriceVersionQuerySet(models.QuerySet):
    def in_force(self, at=None) -> PriceVersion | None:
        at = at or timezone.now()
        return self.filter(effective_from__lte=at).order_by("-effective_from", "-pk").first()


class PriceVersion(models.Model):
    """One dated edition of the price book. Usage is rated by the version in force when it
    ran; a version whose effective time has passed can't be changed (enforced in
    marketplace.services)."""

    currency = models.CharField(max_length=3, default="USD")
    effective_from = models.DateTimeField(db_index=True)
    spot_discount_percent = models.DecimalField(**PERCENT)
    # Reserved commitment discounts off on-demand, by term in months.
    reserved_1m_discount_percent = models.DecimalField(**PERCENT)
    reserved_3m_discount_percent = models.DecimalField(**PERCENT)
    reserved_12m_discount_percent = models.DecimalField(**PERCENT)
    note = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    objects = PriceVersionQuerySet.as_manager()

    class Meta:
        ordering = ["-effective_from", "-pk"]

    def __str__(self) -> str:
        return f"v{self.pk} from {self.effective_from:%Y-%m-%d %H:%M} ({self.currency})"

    def is_editable(self, now=None) -> bool:
        return self.effective_from > (now or timezone.now())

    def reserved_discount(self, months: int) -> Decimal:
        return {
            1: self.reserved_1m_discount_percent,
            3: self.reserved_3m_discount_percent,
            12: self.reserved_12m_discount_percent,
        }[months]


class PriceEntry(models.Model):
    """On-demand price of one GPU type (per GPU-hour) or of CPU (per vCPU-hour) in a region.
    Spot and reserved prices derive from it through the version's discounts."""

    version = models.ForeignKey(PriceVersion, on_delete=models.CASCADE, related_name="entries")
    gpu_type = models.ForeignKey(
        GpuType, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    on_demand_price = models.DecimalField(
        max_digits=PRICE_DIGITS,
        decimal_places=PRICE_PLACES,
        validators=[MinValueValidator(Decimal("0.000001"))],
        help_text="Per GPU-hour, or per vCPU-hour for CPU (no GPU type).",
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["version", "gpu_type", "region"], name="price_entry_unique"
            ),
            models.UniqueConstraint(
                fields=["version", "region"],
                condition=Q(gpu_type=None),
                name="price_entry_unique_cpu",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.gpu_type or 'CPU'} in {self.region}: {self.on_demand_price}"


class CatalogRevision(models.Model):
    """One row whose token changes, in the same transaction, with every change to what
    offers show (price versions and entries, GPU types, regions): processes that keep
    the price book in memory check it with one cheap read (marketplace.price_book_cache)."""

    token = models.CharField(max_length=32)

    def __str__(self) -> str:
        return f"catalog revision {self.token}"


# Storage prices are kept per GiB-hour (the unit metering charges, so an amount is
# size × hours × price exactly); pages show them per GiB-month of 730 hours.
HOURS_PER_MONTH = 730
STORAGE_PRICE_PLACES = 9


class StoragePrice(models.Model):
    """The price of volume storage in a region, in one price-book version: per GiB-hour
    provisioned, while the volume exists, attached or not."""

    version = models.ForeignKey(
        PriceVersion, on_delete=models.CASCADE, related_name="storage_prices"
    )
    region = models.ForeignKey(Region, on_delete=models.PROTECT, related_name="+")
    price_per_gib_hour = models.DecimalField(
        max_digits=PRICE_DIGITS + 3,
        decimal_places=STORAGE_PRICE_PLACES,
        validators=[MinValueValidator(Decimal(0))],
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["version", "region"], name="storage_price_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.region_id}: {self.price_per_gib_month}/GiB-month"

    @property
    def price_per_gib_month(self) -> Decimal:
        return self.price_per_gib_hour * HOURS_PER_MONTH


class TenantPricing(models.Model):
    """Negotiated discount for one tenant, applied on top of the price book."""

    tenant = models.OneToOneField(
        "console.Tenant", on_delete=models.CASCADE, related_name="pricing"
    )
    discount_percent = models.DecimalField(default=Decimal(0), **PERCENT)
    note = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "tenant"

    def __str__(self) -> str:
        return f"{self.tenant}: {self.discount_percent}% off"


class SuspectNode(models.Model):
    """A node whose GPUs reported a hardware fault (an XID error: jobs.repair). Until staff
    mark it healthy, capacity leaves it out, jobs' pods avoid it and, where the console
    may, it is cordoned on the cluster."""

    name = models.CharField(max_length=253, unique=True)  # the Kubernetes node
    pool = models.ForeignKey(
        NodePool, null=True, blank=True, on_delete=models.SET_NULL, related_name="suspect_nodes"
    )
    reason = models.TextField()
    marked_at = models.DateTimeField(default=timezone.now)
    cordoned = models.BooleanField(default=False)

    class Meta:
        ordering = ["-marked_at"]

    def __str__(self) -> str:
        return self.name


class TenantQuota(models.Model):
    """Per-tenant limits: max GPUs of one type (gpu_type set), or tenant-wide limits
    (gpu_type empty: max GPUs of all types together, max concurrent jobs and max GiB of
    volumes)."""

    tenant = models.ForeignKey("console.Tenant", on_delete=models.CASCADE, related_name="quotas")
    gpu_type = models.ForeignKey(
        GpuType, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    max_gpus = models.PositiveIntegerField(null=True, blank=True)
    max_concurrent_jobs = models.PositiveIntegerField(null=True, blank=True)
    # Total size of the tenant's volumes (tenant-wide row only).
    max_storage_gib = models.PositiveIntegerField(null=True, blank=True)

    objects = TenantScopedQuerySet.as_manager()
    tenant_field = "tenant"

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["tenant", "gpu_type"], name="quota_unique"),
            models.UniqueConstraint(
                fields=["tenant"], condition=Q(gpu_type=None), name="quota_unique_tenant_wide"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.gpu_type or 'all GPUs'} ≤ {self.max_gpus}"


class NewTenantPolicy(models.Model):
    """What a new organisation starts with (one row, staff-edited): a tenant-wide quota,
    so a fresh sign-up can't rent a whole pool at once, and whether it needs credit
    before its first launch where Stripe is set up. A missing row means these defaults."""

    default_max_gpus = models.PositiveIntegerField(
        null=True, blank=True, default=8, help_text="Empty: no limit."
    )
    default_max_concurrent_jobs = models.PositiveIntegerField(
        null=True, blank=True, default=4, help_text="Empty: no limit."
    )
    require_credit = models.BooleanField(
        default=True,
        help_text="Where Stripe is configured, an organisation launches only once it has "
        "credit or has paid an invoice.",
    )
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return "New organisation policy"


class ImageKind(models.TextChoices):
    BASE = "base", "Base (OS + driver/CUDA runtime)"
    FRAMEWORK = "framework", "Framework (PyTorch/TensorFlow)"
    FULL_STACK = "full_stack", "Full-stack (framework + data tools)"


class ImageInteractive(models.TextChoices):
    """What an image serves itself for dev environments (blank: a batch image)."""

    NONE = "", "Not interactive"
    SSH = "ssh", "SSH"
    JUPYTER = "jupyter", "Jupyter"
    BOTH = "both", "SSH and Jupyter"


class AllowedRegistry(models.Model):
    """Registries (host and optional path prefix) tenants may add private images from."""

    host = models.CharField(max_length=253)
    path_prefix = models.CharField(max_length=200, blank=True)
    note = models.CharField(max_length=200, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["host", "path_prefix"], name="allowed_registry_unique")
        ]
        ordering = ["host", "path_prefix"]

    def __str__(self) -> str:
        return f"{self.host}/{self.path_prefix}".rstrip("/")


class RegistryCredential(TenantOwnedModel):
    """A tenant's login to one allow-listed registry, for pulling its private images.

    The password (or token) is stored encrypted with console.crypto and never shown again;
    the Kubernetes backend turns it into a `kubernetes.io/dockerconfigjson` Secret in the
    tenant's namespace and names it in the pods' `imagePullSecrets`.
    """

    tenant = models.ForeignKey(
        "console.Tenant", on_delete=models.CASCADE, related_name="registry_credentials"
    )
    # host[:port], lower-case, as image references name it (docker.io for Docker Hub).
    registry = models.CharField(max_length=253)
    username = models.CharField(max_length=200)
    password_encrypted = models.TextField()
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["registry"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "registry"], name="registry_credential_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.username}@{self.registry}"


class ImageQuerySet(TenantScopedQuerySet):
    def for_tenant(self, tenant):
        """What a tenant may use: public images plus its own private ones."""
        if tenant is None:
            return self.filter(tenant__isnull=True)
        return self.filter(Q(tenant__isnull=True) | Q(tenant=tenant))

    def owned_by(self, tenant):
        """What a tenant may change: only its private images."""
        return self.filter(tenant=tenant) if tenant is not None else self.none()


class Image(models.Model):
    tenant_field = "tenant"

    slug = models.SlugField(max_length=80)
    name = models.CharField(max_length=120)
    reference = models.CharField(max_length=400, help_text="registry/repo:tag or @sha256:digest")
    kind = models.CharField(max_length=16, choices=ImageKind.choices)
    cuda_version = models.CharField(max_length=20, blank=True)
    rocm_version = models.CharField(max_length=20, blank=True)
    framework = models.CharField(max_length=40, blank=True)
    framework_version = models.CharField(max_length=40, blank=True)
    # Vendors it runs on ("nvidia", "amd", "huawei") and/or "cpu".
    compatible_with = models.JSONField(default=list)
    size_gib = models.DecimalField(max_digits=6, decimal_places=1, default=Decimal(0))
    description = models.TextField(blank=True)
    default_command = models.JSONField(default=list, blank=True)
    ports = models.JSONField(
        default=list, blank=True, help_text='e.g. [{"name": "jupyter", "port": 8888}]'
    )
    interactive = models.CharField(
        max_length=8,
        choices=ImageInteractive.choices,
        default=ImageInteractive.NONE,
        blank=True,
        help_text="What the image serves itself for dev environments: sshd, Jupyter or both.",
    )
    tenant = models.ForeignKey(
        "console.Tenant",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="private_images",
    )
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(default=timezone.now)

    objects = ImageQuerySet.as_manager()

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["slug"], condition=Q(tenant=None), name="image_public_slug_unique"
            ),
            models.UniqueConstraint(fields=["tenant", "slug"], name="image_tenant_slug_unique"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def is_public(self) -> bool:
        return self.tenant_id is None
