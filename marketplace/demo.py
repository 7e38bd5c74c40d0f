"""The demo catalog: real GPU specifications, plausible prices, 3 regions × 3 tiers,
images of each kind. Used by `manage.py seed_demo`; idempotent."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from marketplace.models import (
    HOURS_PER_MONTH,
    AllowedRegistry,
    Backend,
    GpuType,
    Image,
    NodePool,
    PriceEntry,
    PriceVersion,
    Region,
    StoragePrice,
    Tier,
)

D = Decimal
NV = ("nvidia.com/gpu.product", "nvidia.com/gpu")
# slug, vendor, model, memory GiB, architecture, interconnect, dense FP16/BF16 TFLOP/s,
# (label key, resource), node label value, NVML names, on-demand $/GPU-hour in us-west
GPU_TYPES = [
    (
        "a100-40gb",
        "nvidia",
        "A100 40GB SXM",
        40,
        "Ampere",
        "NVLink 3 (600 GB/s)",
        D("312"),
        NV,
        "NVIDIA-A100-SXM4-40GB",
        ["A100-SXM4-40GB", "A100-PCIE-40GB"],
        D("1.29"),
    ),
    (
        "a100-80gb",
        "nvidia",
        "A100 80GB SXM",
        80,
        "Ampere",
        "NVLink 3 (600 GB/s)",
        D("312"),
        NV,
        "NVIDIA-A100-SXM4-80GB",
        ["A100-SXM4-80GB", "A100 80GB PCIe"],
        D("1.79"),
    ),
    (
        "h100-80gb",
        "nvidia",
        "H100 80GB SXM",
        80,
        "Hopper",
        "NVLink 4 (900 GB/s)",
        D("989.4"),
        NV,
        "NVIDIA-H100-80GB-HBM3",
        ["H100 80GB HBM3", "H100 PCIe"],
        D("2.99"),
    ),
    (
        "h200-141gb",
        "nvidia",
        "H200 141GB SXM",
        141,
        "Hopper",
        "NVLink 4 (900 GB/s)",
        D("989.4"),
        NV,
        "NVIDIA-H200",
        ["H200"],
        D("3.79"),
    ),
    (
        "l40s",
        "nvidia",
        "L40S 48GB",
        48,
        "Ada Lovelace",
        "PCIe Gen4",
        D("362.1"),
        NV,
        "NVIDIA-L40S",
        ["L40S"],
        D("1.04"),
    ),
    (
        "l4",
        "nvidia",
        "L4 24GB",
        24,
        "Ada Lovelace",
        "PCIe Gen4",
        D("121"),
        NV,
        "NVIDIA-L4",
        ["L4"],
        D("0.48"),
    ),
    (
        "rtx-4090",
        "nvidia",
        "GeForce RTX 4090 24GB",
        24,
        "Ada Lovelace",
        "PCIe Gen4",
        D("165.2"),
        NV,
        "NVIDIA-GeForce-RTX-4090",
        ["GeForce RTX 4090"],
        D("0.44"),
    ),
    (
        "mi250",
        "amd",
        "Instinct MI250 128GB",
        128,
        "CDNA 2",
        "Infinity Fabric (800 GB/s)",
        D("362.1"),
        ("amd.com/gpu.product-name", "amd.com/gpu"),
        "AMD_Instinct_MI250",
        [],
        D("1.19"),
    ),
    (
        "mi300x",
        "amd",
        "Instinct MI300X 192GB",
        192,
        "CDNA 3",
        "Infinity Fabric (896 GB/s)",
        D("1307.4"),
        ("amd.com/gpu.product-name", "amd.com/gpu"),
        "AMD_Instinct_MI300X",
        [],
        D("2.49"),
    ),
    (
        "ascend-910b",
        "huawei",
        "Ascend 910B 64GB",
        64,
        "Da Vinci",
        "HCCS (392 GB/s)",
        D("320"),
        ("accelerator", "huawei.com/Ascend910"),
        "huawei-Ascend910B",
        [],
        D("1.39"),
    ),
]
REGIONS = [
    ("us-west", "US West (Oregon)", D("1.00")),
    ("us-east", "US East (Virginia)", D("1.00")),
    ("eu-central", "EU Central (Frankfurt)", D("1.10")),
    ("local", "This host", D("1.00")),
]
CPU_PRICE_PER_VCPU_HOUR = D("0.0125")
STORAGE_PRICE_PER_GIB_MONTH = D("0.10")
# (region, gpu slug, tier, nodes, GPUs per node, vCPUs per node, memory GiB per node)
DEMO_POOLS = [
    ("us-west", "h100-80gb", Tier.ON_DEMAND, 8, 8, 208, 1800),
    ("us-west", "h100-80gb", Tier.SPOT, 4, 8, 208, 1800),
    ("us-west", "h100-80gb", Tier.RESERVED, 4, 8, 208, 1800),
    ("us-west", "a100-80gb", Tier.ON_DEMAND, 4, 8, 128, 1000),
    ("us-west", "a100-80gb", Tier.SPOT, 4, 8, 128, 1000),
    ("us-west", "h200-141gb", Tier.ON_DEMAND, 2, 8, 208, 2000),
    ("us-west", "l40s", Tier.SPOT, 6, 4, 64, 512),
    ("us-east", "a100-40gb", Tier.ON_DEMAND, 4, 8, 96, 1000),
    ("us-east", "a100-80gb", Tier.RESERVED, 2, 8, 128, 1000),
    ("us-east", "l4", Tier.ON_DEMAND, 8, 4, 48, 192),
    ("us-east", "rtx-4090", Tier.SPOT, 8, 4, 32, 128),
    ("us-east", "mi250", Tier.ON_DEMAND, 2, 8, 128, 1000),
    ("us-east", "mi300x", Tier.ON_DEMAND, 2, 8, 192, 2000),
    ("eu-central", "h100-80gb", Tier.ON_DEMAND, 4, 8, 208, 1800),
    ("eu-central", "a100-80gb", Tier.SPOT, 4, 8, 128, 1000),
    ("eu-central", "ascend-910b", Tier.ON_DEMAND, 2, 8, 192, 1500),
    ("eu-central", "l40s", Tier.RESERVED, 4, 4, 64, 512),
    ("eu-central", "mi300x", Tier.SPOT, 1, 8, 192, 2000),
]
DEMO_CPU_POOLS = [("us-west", 4, 64, 256), ("us-east", 4, 64, 256), ("eu-central", 2, 64, 256)]
IMAGES = [
    # slug, name, reference, kind, cuda, rocm, framework, version, compatible, size GiB,
    # description, default command, ports
    (
        "cuda-12-4-runtime",
        "CUDA 12.4 runtime (Ubuntu 22.04)",
        "docker.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04",
        "base",
        "12.4",
        "",
        "",
        "",
        ["nvidia"],
        D("3.5"),
        "Driver-compatible CUDA runtime for your own binaries.",
        ["nvidia-smi"],
        [],
    ),
    (
        "cuda-12-8-devel",
        "CUDA 12.8 devel (Ubuntu 24.04)",
        "docker.io/nvidia/cuda:12.8.0-devel-ubuntu24.04",
        "base",
        "12.8",
        "",
        "",
        "",
        ["nvidia"],
        D("9.8"),
        "CUDA toolkit with nvcc for building kernels.",
        ["nvcc", "--version"],
        [],
    ),
    (
        "rocm-6-2",
        "ROCm 6.2 (Ubuntu 22.04)",
        "docker.io/rocm/dev-ubuntu-22.04:6.2",
        "base",
        "",
        "6.2",
        "",
        "",
        ["amd"],
        D("6.1"),
        "ROCm runtime and tools for AMD Instinct GPUs.",
        ["rocm-smi"],
        [],
    ),
    (
        "ubuntu-22-04",
        "Ubuntu 22.04 (CPU)",
        "docker.io/library/ubuntu:22.04",
        "base",
        "",
        "",
        "",
        "",
        ["cpu", "nvidia", "amd", "huawei"],
        D("0.1"),
        "Plain Ubuntu for CPU jobs and tools.",
        ["bash", "-lc", "uname -a"],
        [],
    ),
    # The contract's CPU image: jobs with gpus_per_node 0 run it on the local backend.
    (
        "python-3.11",
        "Python 3.11 (CPU)",
        "docker.io/library/python:3.11-slim",
        "base",
        "",
        "",
        "Python",
        "3.11",
        ["cpu", "nvidia", "amd"],
        D("0.05"),
        "Python for CPU jobs and scripts. On the local backend the command runs on the host "
        "with the console's own Python first on PATH.",
        ["python", "--version"],
        [],
    ),
    (
        "pytorch-2-5-cuda12-4",
        "PyTorch 2.5 · CUDA 12.4",
        "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime",
        "framework",
        "12.4",
        "",
        "PyTorch",
        "2.5.1",
        ["nvidia", "cpu"],
        D("7.6"),
        "PyTorch with cuDNN 9; torchrun for multi-node jobs.",
        ["python", "-c", "import torch; print(torch.cuda.device_count())"],
        [],
    ),
    (
        "tensorflow-2-17-gpu",
        "TensorFlow 2.17 GPU",
        "docker.io/tensorflow/tensorflow:2.17.0-gpu",
        "framework",
        "12.3",
        "",
        "TensorFlow",
        "2.17.0",
        ["nvidia"],
        D("7.9"),
        "TensorFlow with CUDA and cuDNN.",
        ["python", "-c", "import tensorflow as tf; print(tf.config.list_physical_devices())"],
        [],
    ),
    (
        "pytorch-rocm-6-2",
        "PyTorch 2.3 · ROCm 6.2",
        "docker.io/rocm/pytorch:rocm6.2_ubuntu22.04_py3.10_pytorch_release_2.3.0",
        "framework",
        "",
        "6.2",
        "PyTorch",
        "2.3.0",
        ["amd"],
        D("19.5"),
        "PyTorch built for ROCm.",
        ["python", "-c", "import torch; print(torch.cuda.device_count())"],
        [],
    ),
    (
        "mindspore-ascend-2-3",
        "MindSpore 2.3 · Ascend",
        "docker.io/mindspore/mindspore-ascend:2.3.1",
        "framework",
        "",
        "",
        "MindSpore",
        "2.3.1",
        ["huawei"],
        D("12.0"),
        "MindSpore with CANN for Ascend 910B.",
        ["python", "-c", "import mindspore"],
        [],
    ),
    (
        "ngc-pytorch-24-10",
        "NGC PyTorch 24.10",
        "nvcr.io/nvidia/pytorch:24.10-py3",
        "full_stack",
        "12.6",
        "",
        "PyTorch",
        "2.5.0a0",
        ["nvidia"],
        D("21.4"),
        "NVIDIA's tuned PyTorch with Apex, Transformer Engine, DALI and Jupyter.",
        ["jupyter", "lab", "--ip=0.0.0.0", "--no-browser"],
        [{"name": "jupyter", "port": 8888}],
    ),
    (
        "hf-transformers-pytorch",
        "Hugging Face Transformers (PyTorch GPU)",
        "docker.io/huggingface/transformers-pytorch-gpu:4.41.3",
        "full_stack",
        "12.1",
        "",
        "PyTorch",
        "2.3.0",
        ["nvidia"],
        D("10.2"),
        "Transformers, Datasets, Accelerate and PEFT on PyTorch.",
        ["python", "-c", "import transformers; print(transformers.__version__)"],
        [{"name": "jupyter", "port": 8888}, {"name": "ssh", "port": 22}],
    ),
]
ALLOWED_REGISTRIES = [
    ("docker.io", "", "Docker Hub"),
    ("nvcr.io", "", "NVIDIA NGC"),
    ("ghcr.io", "", "GitHub Container Registry"),
]


def _serves(ports: list[dict]) -> str:
    """What a demo image serves for dev environments: what its declared ports say."""
    names = {port["name"] for port in ports} & {"jupyter", "ssh"}
    return "both" if len(names) == 2 else next(iter(names), "")


@transaction.atomic
def _demo_interconnects(gpu_type: GpuType, nodes: int) -> list[str]:
    """NVLink where the GPU type has it; an RDMA network (InfiniBand for H100/H200) in
    pools built for multi-node training (four nodes or more)."""
    links = ["nvlink"] if "NVLink" in gpu_type.interconnect else []
    if links and nodes >= 4:
        links += ["infiniband", "rdma"] if gpu_type.slug.startswith("h") else ["rdma"]
    return sorted(links)


def seed_catalog() -> dict[str, int]:
    regions = {}
    for slug, name, _ in REGIONS:
        regions[slug], _ = Region.objects.get_or_create(slug=slug, defaults={"name": name})
    gpu_types = {}
    for slug, vendor, model, memory, arch, link, tflops, (
        label_key,
        resource,
    ), label_value, nvml, _price in GPU_TYPES:
        gpu_types[slug], _ = GpuType.objects.get_or_create(
            slug=slug,
            defaults={
                "vendor": vendor,
                "model": model,
                "memory_gib": memory,
                "architecture": arch,
                "interconnect": link,
                "peak_tflops": tflops,
                "node_label_key": label_key,
                "node_label_value": label_value,
                "resource_name": resource,
                "nvml_names": nvml,
            },
        )
    if not PriceVersion.objects.exists():
        version = PriceVersion.objects.create(
            currency="USD",
            effective_from=timezone.now() - timezone.timedelta(days=90),
            spot_discount_percent=D("55"),
            reserved_1m_discount_percent=D("15"),
            reserved_3m_discount_percent=D("25"),
            reserved_12m_discount_percent=D("40"),
            note="Demo launch prices",
        )
        entries = []
        for region_slug, _, factor in REGIONS:
            for row in GPU_TYPES:
                entries.append(
                    PriceEntry(
                        version=version,
                        gpu_type=gpu_types[row[0]],
                        region=regions[region_slug],
                        on_demand_price=row[-1] * factor,
                    )
                )
            entries.append(
                PriceEntry(
                    version=version,
                    gpu_type=None,
                    region=regions[region_slug],
                    on_demand_price=CPU_PRICE_PER_VCPU_HOUR * factor,
                )
            )
        PriceEntry.objects.bulk_create(entries)
        # Volumes: 0.10 per GiB-month (× the region's factor), kept per GiB-hour.
        StoragePrice.objects.bulk_create(
            StoragePrice(
                version=version,
                region=regions[region_slug],
                price_per_gib_hour=(
                    STORAGE_PRICE_PER_GIB_MONTH * factor / HOURS_PER_MONTH
                ).quantize(D("0.000000001")),
            )
            for region_slug, _, factor in REGIONS
        )
    # Demo fleet: stands in for a cluster until one is configured (COMPUTE_BACKENDS).
    for region_slug, gpu_slug, tier, nodes, per_node, vcpus, memory in DEMO_POOLS:
        NodePool.objects.get_or_create(
            slug=f"demo-{region_slug}-{gpu_slug}-{tier}".replace("_", "-"),
            defaults={
                "name": f"{gpu_types[gpu_slug].model} · {region_slug} · {tier.replace('_', '-')}",
                "region": regions[region_slug],
                "backend": Backend.KUBERNETES,
                "tier": tier,
                "gpu_type": gpu_types[gpu_slug],
                # What the sandbox's nodes are labelled with (capacity sync reads it back).
                "interconnects": _demo_interconnects(gpu_types[gpu_slug], nodes),
                "cpu_arch": "arm64" if gpu_slug == "ascend-910b" else "amd64",
                "node_count": nodes,
                "gpus_per_node": per_node,
                "total_gpus": nodes * per_node,
                "allocatable_gpus": nodes * per_node,
                "vcpus_per_node": vcpus,
                "memory_gib_per_node": memory,
                "allocatable_vcpus": nodes * vcpus,
            },
        )
    for region_slug, nodes, vcpus, memory in DEMO_CPU_POOLS:
        NodePool.objects.get_or_create(
            slug=f"demo-{region_slug}-cpu-on-demand",
            defaults={
                "name": f"CPU · {region_slug} · on-demand",
                "region": regions[region_slug],
                "backend": Backend.KUBERNETES,
                "tier": Tier.ON_DEMAND,
                "gpu_type": None,
                "cpu_arch": "amd64",
                "node_count": nodes,
                "vcpus_per_node": vcpus,
                "memory_gib_per_node": memory,
                "allocatable_vcpus": nodes * vcpus,
            },
        )
    for (
        slug,
        name,
        reference,
        kind,
        cuda,
        rocm,
        framework,
        version,
        compatible,
        size,
        description,
        command,
        ports,
    ) in IMAGES:
        Image.objects.get_or_create(
            slug=slug,
            tenant=None,
            defaults={
                "name": name,
                "reference": reference,
                "kind": kind,
                "cuda_version": cuda,
                "rocm_version": rocm,
                "framework": framework,
                "framework_version": version,
                "compatible_with": compatible,
                "size_gib": size,
                "description": description,
                "default_command": command,
                "ports": ports,
                "interactive": _serves(ports),
            },
        )
    for host, prefix, note in ALLOWED_REGISTRIES:
        AllowedRegistry.objects.get_or_create(
            host=host, path_prefix=prefix, defaults={"note": note}
        )
    return {"gpu_types": len(gpu_types), "regions": len(regions), "images": len(IMAGES)}
