"""The local backend: work runs as processes on this host; GPUs are found with NVML."""

from __future__ import annotations

import logging
import os
import socket
from collections import Counter

from jobs.backends.base import NodeInventory

log = logging.getLogger(__name__)
LOCAL_REGION = "local"


def _memory_gib() -> int:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // (1024 * 1024)
    except OSError:
        pass
    return 0


def nvml_gpu_names() -> list[str]:
    """Names of this host's GPUs as NVML reports them; empty without a driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []  # no NVIDIA driver on this host: a CPU-only machine
    try:
        names = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            names.append(name.decode() if isinstance(name, bytes) else name)
        return names
    finally:
        pynvml.nvmlShutdown()


class LocalBackend:
    name = "local"

    def inventory(self) -> list[NodeInventory]:
        host = socket.gethostname()
        vcpus = os.cpu_count() or 1
        memory = _memory_gib()
        nodes = [
            NodeInventory(
                name=f"{host}/cpu",
                region=LOCAL_REGION,
                tier="on_demand",
                vcpus_allocatable=vcpus,
                memory_gib=memory,
            )
        ]
        # One inventory entry per GPU model on the host (mixed hosts are possible).
        for product, count in Counter(nvml_gpu_names()).items():
            nodes.append(
                NodeInventory(
                    name=f"{host}/{product}",
                    region=LOCAL_REGION,
                    tier="on_demand",
                    gpu_resource="nvidia.com/gpu",
                    gpu_product=product,
                    gpus_allocatable=count,
                    vcpus_allocatable=vcpus,
                    memory_gib=memory,
                )
            )
        return nodes
