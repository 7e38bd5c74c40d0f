"""The GPU recommender: how much GPU memory a model needs for a workload, and which GPU
configurations of the catalog hold it, cheapest first.

The memory rules are data (the tables and formulas below, each with its source), so a
reviewer checks one page. Sizes are bytes (GiB = 2**30 for display); money is the price
book's, through `marketplace.pricing` (the one pricing rule), never a second copy.

Assumptions, stated once:
- Several GPUs share the memory evenly: training shards weights, gradients and optimizer
  state across them (ZeRO-3 / FSDP) and splits the batch; inference splits the model by
  tensor parallelism. So a job needing M bytes runs on ceil(M × (1 + margin) / card) GPUs.
- Training keeps activations by checkpointing every transformer layer and uses
  FlashAttention (what every fine-tuning recipe does); inference keeps a KV cache.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum

from console.models import Tenant
from console.service_errors import ServiceError
from marketplace.models import GpuType, Region, Tier, free_capacity
from marketplace.price_book_cache import price_book
from marketplace.pricing import after_tenant_discount, tenant_discount_percent, to_cents
from marketplace.selectors import pools_for_tenant

GIB = 2**30
BILLION = 10**9

# Keep 20 % of GPU memory in reserve when deciding whether a configuration fits: CUDA
# context, allocator fragmentation and framework buffers that no formula sees. It is issue
# 31's documented `memory_margin` knob (default 0.2); callers may pass another margin.
MEMORY_MARGIN = 0.2


class Workload(StrEnum):
    PRETRAIN = "pretrain"
    FULL_FINETUNE = "full_finetune"
    LORA = "lora"
    QLORA = "qlora"
    INFERENCE = "inference"

    @property
    def label(self) -> str:
        return WORKLOAD_LABELS[self]


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    INT8 = "int8"
    INT4 = "int4"


WORKLOAD_LABELS = {
    Workload.PRETRAIN: "Pre-training",
    Workload.FULL_FINETUNE: "Full fine-tune",
    Workload.LORA: "LoRA fine-tune",
    Workload.QLORA: "QLoRA fine-tune",
    Workload.INFERENCE: "Inference",
}
TRAINING = frozenset({Workload.PRETRAIN, Workload.FULL_FINETUNE})
ADAPTERS = frozenset({Workload.LORA, Workload.QLORA})

# Bytes per stored weight at each precision (inference, and the frozen base of LoRA/QLoRA):
# fp32 4, bf16/fp16 2, int8 1 (LLM.int8, Dettmers et al. 2022), int4 0.5 (GPTQ/AWQ, and
# QLoRA's NF4, Dettmers et al. 2023; its per-block constants are ~0.13 bit and ignored).
WEIGHT_BYTES = {
    Precision.FP32: 4.0,
    Precision.BF16: 2.0,
    Precision.FP16: 2.0,
    Precision.INT8: 1.0,
    Precision.INT4: 0.5,
}

# Full training with AdamW, bytes per parameter as (weights, gradients, optimizer state).
# Mixed precision (ZeRO, Rajbhandari et al. 2020, §3.1: "2Ψ + 2Ψ + 12Ψ = 16Ψ"): 16-bit
# weights and gradients, an fp32 master copy plus Adam's m and v in the optimizer, 16 bytes
# in all before activations (18 where gradients are kept in fp32). Pure fp32: 4 + 4 + 8.
TRAINING_BYTES_PER_PARAMETER = {
    Precision.FP32: (4.0, 4.0, 8.0),
    Precision.BF16: (2.0, 2.0, 12.0),
    Precision.FP16: (2.0, 2.0, 12.0),
}

# LoRA's trainable adapter, bytes per adapter parameter as (weights, gradients, optimizer):
# PEFT keeps trainable adapters in fp32 under autocast, with AdamW's m and v in fp32.
ADAPTER_BYTES_PER_PARAMETER = (4.0, 4.0, 8.0)
DEFAULT_LORA_RANK = 16  # QLoRA paper's default (r = 16 on every linear layer)

# Which base precisions each workload accepts: full training has no 8- or 4-bit optimizer
# path here; LoRA freezes a floating-point base, QLoRA a quantized one (its definition).
PRECISIONS = {
    Workload.PRETRAIN: (Precision.FP32, Precision.BF16, Precision.FP16),
    Workload.FULL_FINETUNE: (Precision.FP32, Precision.BF16, Precision.FP16),
    Workload.LORA: (Precision.FP32, Precision.BF16, Precision.FP16),
    Workload.QLORA: (Precision.INT8, Precision.INT4),
    Workload.INFERENCE: tuple(Precision),
}

# Activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
# Transformer Models", §4.1): one layer holds s·b·h·(34 + 5·a·s/h) bytes with 16-bit
# values, i.e. 17 + 2.5·a·s/h values per token and hidden unit; FlashAttention removes the
# a·s/h term. With full activation checkpointing a model keeps each layer's input (1 value
# per token and hidden unit per layer) plus one layer's working set while recomputing.
LAYER_WORKING_VALUES = 17
CHECKPOINT_VALUES_PER_LAYER = 1
# The loss's logits are fp32: sequence × batch × vocabulary × 4 bytes.
LOGIT_BYTES = 4
# Inference runs one layer at a time and keeps nothing for a backward pass: the residual
# stream, Q/K/V and the 4h-wide MLP intermediate, about 8 values per token and hidden unit.
INFERENCE_WORKING_VALUES = 8

# KV cache (vLLM's PagedAttention accounting): 2 (K and V) × layers × KV heads × head_dim
# × sequence × batch × bytes; the cache stays 16-bit when only the weights are quantized
# (vLLM's kv_cache_dtype "auto" is the model's compute dtype), fp32 for fp32 models.
KV_CACHE_BYTES = {p: 4.0 if p == Precision.FP32 else 2.0 for p in Precision}
# Activation values are 16-bit except in an fp32 model (QLoRA computes in bf16).
ACTIVATION_BYTES = {p: 4.0 if p == Precision.FP32 else 2.0 for p in Precision}

# Model shape from the parameter count alone (a decoder-only transformer):
# parameters ≈ 12 · layers · hidden² (Kaplan et al. 2020, §2.1, embeddings aside), with
# head_dim 128 and layers = hidden / 128 (Llama's aspect ratio: 7B → 4096 × 32), so
# hidden = ∛(128 · parameters / 12), rounded to whole heads. KV heads default to the
# attention heads (multi-head attention: the larger cache; pass kv_heads for GQA models),
# the MLP is 4 × hidden wide, and the vocabulary Llama-2's 32,000 tokens.
DEFAULT_HEAD_DIM = 128
LAYERS_PER_HIDDEN = 1 / 128
PARAMETERS_PER_LAYER_HIDDEN2 = 12
FFN_MULTIPLIER = 4
DEFAULT_VOCABULARY = 32_000


@dataclass(frozen=True)
class ModelShape:
    parameters: int
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn_size: int
    vocabulary: int

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


def model_shape(
    *,
    parameters_billion: float,
    layers: int | None = None,
    hidden_size: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    vocabulary: int | None = None,
) -> ModelShape:
    """The shape of a model of this size, as given or derived (see the rule above)."""
    parameters = round(parameters_billion * BILLION)
    head_dim = head_dim or DEFAULT_HEAD_DIM
    if hidden_size is None:
        if layers is None:
            raw = (parameters / (PARAMETERS_PER_LAYER_HIDDEN2 * LAYERS_PER_HIDDEN)) ** (1 / 3)
        else:
            raw = math.sqrt(parameters / (PARAMETERS_PER_LAYER_HIDDEN2 * layers))
        hidden_size = max(1, round(raw / head_dim)) * head_dim
    if layers is None:
        layers = max(1, round(parameters / (PARAMETERS_PER_LAYER_HIDDEN2 * hidden_size**2)))
    heads = max(1, hidden_size // head_dim)
    if kv_heads is not None and kv_heads > heads:
        raise ServiceError(
            f"A model {hidden_size} wide with {head_dim}-wide heads has {heads} attention "
            f"head{'s' if heads != 1 else ''}; it can't have {kv_heads} KV heads.",
            field="kv_heads",
        )
    return ModelShape(
        parameters=parameters,
        layers=layers,
        hidden_size=hidden_size,
        heads=heads,
        kv_heads=kv_heads or heads,
        head_dim=head_dim,
        ffn_size=FFN_MULTIPLIER * hidden_size,
        vocabulary=vocabulary or DEFAULT_VOCABULARY,
    )


def lora_parameters(shape: ModelShape, rank: int) -> int:
    """Trainable parameters of LoRA adapters of `rank` on every linear layer (q, k, v, o,
    gate, up, down): a d_in × d_out matrix gains rank × (d_in + d_out)."""
    h, kv, ffn = shape.hidden_size, shape.kv_width, shape.ffn_size
    per_layer = 2 * (h + h) + 2 * (h + kv) + 3 * (h + ffn)
    return rank * shape.layers * per_layer


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes of GPU memory the whole job needs (over all its GPUs), by what holds them."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    kv_cache: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.kv_cache

    def gib(self) -> dict[str, float]:
        return {name: gib(getattr(self, name)) for name in BREAKDOWN_PARTS}


BREAKDOWN_PARTS = ("weights", "gradients", "optimizer", "activations", "kv_cache")
BREAKDOWN_LABELS = {
    "weights": "Weights",
    "gradients": "Gradients",
    "optimizer": "Optimizer state",
    "activations": "Activations",
    "kv_cache": "KV cache",
}


def gib(size: float) -> float:
    """Bytes as GiB to one decimal (rounded up: never promise less than the need)."""
    return math.ceil(size / GIB * 10) / 10


def memory_needed(
    *,
    shape: ModelShape,
    workload: Workload,
    precision: Precision,
    sequence_length: int,
    batch_size: int,
    lora_rank: int = DEFAULT_LORA_RANK,
) -> MemoryBreakdown:
    """GPU memory for `workload` on a model of `shape` (refused where the workload has no
    path at that precision)."""
    if precision not in PRECISIONS[workload]:
        allowed = ", ".join(PRECISIONS[workload])
        raise ServiceError(
            f"{workload.label} runs at {allowed}, not {precision}.", field="precision"
        )
    p = shape.parameters
    tokens_hidden = sequence_length * batch_size * shape.hidden_size
    act_bytes = ACTIVATION_BYTES[precision]
    if workload == Workload.INFERENCE:
        return MemoryBreakdown(
            weights=p * WEIGHT_BYTES[precision],
            gradients=0.0,
            optimizer=0.0,
            activations=INFERENCE_WORKING_VALUES * tokens_hidden * act_bytes,
            kv_cache=2.0
            * shape.layers
            * shape.kv_width
            * sequence_length
            * batch_size
            * KV_CACHE_BYTES[precision],
        )
    activations = (
        (CHECKPOINT_VALUES_PER_LAYER * shape.layers + LAYER_WORKING_VALUES)
        * tokens_hidden
        * act_bytes
    ) + sequence_length * batch_size * shape.vocabulary * LOGIT_BYTES
    if workload in TRAINING:
        weights, gradients, optimizer = TRAINING_BYTES_PER_PARAMETER[precision]
        return MemoryBreakdown(
            weights=p * weights,
            gradients=p * gradients,
            optimizer=p * optimizer,
            activations=activations,
            kv_cache=0.0,
        )
    adapter = lora_parameters(shape, lora_rank)
    weights, gradients, optimizer = ADAPTER_BYTES_PER_PARAMETER
    return MemoryBreakdown(
        weights=p * WEIGHT_BYTES[precision] + adapter * weights,
        gradients=adapter * gradients,
        optimizer=adapter * optimizer,
        activations=activations,
        kv_cache=0.0,
    )


@dataclass(frozen=True)
class GpuOption:
    """One way to hold the job: `gpus` GPUs of a type in a region, as `nodes` nodes of
    `gpus_per_node`. `fits` when the pools there are big enough for it at all;
    `available_now` when enough of their GPUs are free at this moment."""

    gpu_type: GpuType
    region: Region
    tier: str
    gpus: int
    gpus_per_node: int
    nodes: int
    fits: bool
    price_per_hour: Decimal
    currency: str
    available_now: bool
    free_gpus: int
    memory_per_gpu_gib: float  # the job's share of each GPU's memory, margin aside


@dataclass(frozen=True)
class Recommendation:
    shape: ModelShape
    breakdown: MemoryBreakdown
    memory_margin: float
    options: list[GpuOption]

    @property
    def memory_needed(self) -> float:
        return self.breakdown.total

    @property
    def memory_with_margin(self) -> float:
        return self.breakdown.total * (1 + self.memory_margin)

    # For people (the console's panel): GiB to one decimal, the parts that hold memory.
    @property
    def memory_needed_gib(self) -> float:
        return gib(self.memory_needed)

    @property
    def memory_with_margin_gib(self) -> float:
        return gib(self.memory_with_margin)

    @property
    def margin_percent(self) -> int:
        return round(self.memory_margin * 100)

    @property
    def parts(self) -> list[tuple[str, float]]:
        sizes = self.breakdown.gib()
        return [(BREAKDOWN_LABELS[name], sizes[name]) for name in BREAKDOWN_PARTS if sizes[name]]


def configuration(
    *, need_with_margin: float, gpu_memory_gib: int, gpus_per_node: int
) -> tuple[int, int, int]:
    """(GPUs, GPUs per node, nodes) of the smallest configuration holding the need: one
    node while it suffices, else as few nodes as hold it with the GPUs spread evenly."""
    gpus = max(1, math.ceil(need_with_margin / (gpu_memory_gib * GIB)))
    if gpus <= gpus_per_node:
        return gpus, gpus, 1
    nodes = math.ceil(gpus / gpus_per_node)
    per_node = math.ceil(gpus / nodes)
    return per_node * nodes, per_node, nodes


def gpu_recommendations(
    *,
    tenant: Tenant | None,
    parameters_billion: float,
    workload: Workload,
    precision: Precision,
    sequence_length: int,
    batch_size: int,
    tier: str = Tier.ON_DEMAND,
    region: Region | None = None,
    layers: int | None = None,
    hidden_size: int | None = None,
    kv_heads: int | None = None,
    head_dim: int | None = None,
    lora_rank: int = DEFAULT_LORA_RANK,
    memory_margin: float = MEMORY_MARGIN,
) -> Recommendation:
    """The memory the job needs and, for every GPU type × region the tenant can launch on
    (a pool of it in the tier), the smallest configuration that holds it with the margin,
    priced by the price book in force with the tenant's discount; fitting options first,
    then by price per hour."""
    shape = model_shape(
        parameters_billion=parameters_billion,
        layers=layers,
        hidden_size=hidden_size,
        kv_heads=kv_heads,
        head_dim=head_dim,
    )
    breakdown = memory_needed(
        shape=shape,
        workload=workload,
        precision=precision,
        sequence_length=sequence_length,
        batch_size=batch_size,
        lora_rank=lora_rank,
    )
    need_with_margin = breakdown.total * (1 + memory_margin)
    pools = pools_for_tenant(tenant).filter(tier=tier, gpu_type__isnull=False, gpus_per_node__gt=0)
    if region is not None:
        pools = pools.filter(region=region)
    # Per GPU type × region: the largest node, the node count and the free GPUs.
    shapes: dict[tuple[int, int], dict[str, int]] = defaultdict(
        lambda: {"per_node": 0, "nodes": 0, "free": 0}
    )
    for pool in pools.values(
        "gpu_type_id", "region_id", "gpus_per_node", "node_count", "allocatable_gpus", "in_use_gpus"
    ):
        bucket = shapes[(pool["gpu_type_id"], pool["region_id"])]
        bucket["per_node"] = max(bucket["per_node"], pool["gpus_per_node"])
        bucket["nodes"] += pool["node_count"]
        bucket["free"] += free_capacity(pool["allocatable_gpus"], pool["in_use_gpus"])

    options: list[GpuOption] = []
    book = price_book()
    if book is not None and shapes:
        discount = tenant_discount_percent(tenant)
        for priced in book.entries:
            entry = priced.entry
            if entry.gpu_type_id is None:  # a CPU price
                continue
            pool_shape = shapes.get((entry.gpu_type_id, entry.region_id))
            if entry.gpu_type is None or pool_shape is None:
                continue
            gpus, per_node, nodes = configuration(
                need_with_margin=need_with_margin,
                gpu_memory_gib=entry.gpu_type.memory_gib,
                gpus_per_node=pool_shape["per_node"],
            )
            # The estimate's arithmetic (pricing.estimate_cost): units × discounted unit
            # price, rounded to the cent once.
            unit_price = after_tenant_discount(priced.prices.for_tier(tier), discount)
            options.append(
                GpuOption(
                    gpu_type=entry.gpu_type,
                    region=entry.region,
                    tier=tier,
                    gpus=gpus,
                    gpus_per_node=per_node,
                    nodes=nodes,
                    fits=nodes <= pool_shape["nodes"],
                    price_per_hour=to_cents(gpus * unit_price),
                    currency=book.version.currency,
                    available_now=pool_shape["free"] >= gpus,
                    free_gpus=pool_shape["free"],
                    memory_per_gpu_gib=gib(breakdown.total / gpus),
                )
            )
    options.sort(
        key=lambda o: (not o.fits, o.price_per_hour, o.gpus, o.gpu_type.slug, o.region.slug)
    )
    return Recommendation(
        shape=shape, breakdown=breakdown, memory_margin=memory_margin, options=options
    )
