"""Reading GPU metrics at their source, for the backends' `gpu_readings`.

- NVML (nvidia-ml-py) for GPUs of this host, by device index (the local backend);
- the DCGM exporter's metrics through Prometheus's HTTP API, one instant query for every
  running job (series are matched to jobs by pod name `gg-<job>-a<attempt>[-spot]-<index>-…`;
  the Kubernetes backend).

Only the reading type comes from jobs.backends.base, so backends import this module
without a cycle.
"""

from __future__ import annotations

import re
import socket
from collections import defaultdict
from typing import TYPE_CHECKING

import httpx

from jobs.backends.base import GpuReading

if TYPE_CHECKING:
    from jobs.models import Job

DCGM_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "utilization",
    "DCGM_FI_DEV_FB_USED": "memory_used_mib",
    "DCGM_FI_DEV_FB_FREE": "memory_free_mib",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
    "DCGM_FI_DEV_XID_ERRORS": "xid",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "ecc_dbe",
}
# Our pods' names (jobs.backends.kubernetes.manifests.job_name + the Indexed Job suffix).
POD_NAME = re.compile(r"^gg-(?P<job>\d+)-a(?P<attempt>\d+)(?P<spot>-spot)?-(?P<index>\d+)-")


def nvml_readings(devices: list[int]) -> list[GpuReading] | None:
    """Readings of this host's GPUs `devices` (NVML indices); None without NVML."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    host = socket.gethostname()
    readings = []
    try:
        for index in devices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)

            def read(call, handle=handle):
                try:
                    return call(handle)
                except pynvml.NVMLError:
                    return None  # a field this GPU doesn't report (e.g. power on some)

            utilization = read(pynvml.nvmlDeviceGetUtilizationRates)
            memory = read(pynvml.nvmlDeviceGetMemoryInfo)
            power_mw = read(pynvml.nvmlDeviceGetPowerUsage)
            temperature = read(
                lambda h: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            )
            readings.append(
                GpuReading(
                    node=host,
                    gpu=index,
                    utilization=float(utilization.gpu) if utilization is not None else None,
                    memory_used_mib=memory.used / 2**20 if memory is not None else None,
                    memory_total_mib=memory.total / 2**20 if memory is not None else None,
                    power_w=power_mw / 1000.0 if power_mw is not None else None,
                    temperature_c=float(temperature) if temperature is not None else None,
                )
            )
    finally:
        pynvml.nvmlShutdown()
    return readings


def dcgm_query() -> str:
    """One PromQL instant query for every DCGM field of every pod of ours. Exporters
    scraped through a ServiceMonitor carry the workload's pod as `exported_pod`."""
    names = "|".join(DCGM_FIELDS)
    return (
        f'{{__name__=~"{names}",pod=~"gg-[0-9]+-a.+"}} or '
        f'{{__name__=~"{names}",exported_pod=~"gg-[0-9]+-a.+"}}'
    )


def prometheus_readings(
    jobs: list[Job], *, url: str, timeout: float = 5.0
) -> dict[int, list[GpuReading]]:
    """Readings of the running Kubernetes `jobs`, from one Prometheus query.

    Raises httpx.HTTPError when Prometheus can't be reached or answers an error."""
    wanted = {job.pk: job for job in jobs}
    response = httpx.get(
        f"{url.rstrip('/')}/api/v1/query", params={"query": dcgm_query()}, timeout=timeout
    )
    response.raise_for_status()
    body = response.json()
    if body.get("status") != "success":
        raise httpx.HTTPError(f"Prometheus query failed: {body.get('error', body)}")
    values: dict[tuple[int, str, int], dict[str, float]] = defaultdict(dict)
    hosts: dict[tuple[int, str, int], str] = {}
    for series in body["data"]["result"]:
        labels = series["metric"]
        pod = labels.get("exported_pod") or labels.get("pod") or ""
        match = POD_NAME.match(pod)
        if match is None:
            continue
        job = wanted.get(int(match["job"]))
        if job is None or int(match["attempt"]) != job.attempt:
            continue
        rank = int(match["index"]) + (job.on_demand_nodes if match["spot"] else 0)
        try:
            gpu = int(labels.get("gpu", 0))
            value = float(series["value"][1])
        except (TypeError, ValueError):
            continue
        field = DCGM_FIELDS.get(labels.get("__name__", ""))
        if field:
            values[(job.pk, f"rank {rank}", gpu)][field] = value
            if labels.get("Hostname"):  # dcgm-exporter's name for the node
                hosts[(job.pk, f"rank {rank}", gpu)] = labels["Hostname"]
    readings: dict[int, list[GpuReading]] = defaultdict(list)
    for (job_id, node, gpu), fields in sorted(values.items()):
        used, free = fields.get("memory_used_mib"), fields.get("memory_free_mib")
        xid = fields.get("xid")
        readings[job_id].append(
            GpuReading(
                node=node,
                gpu=gpu,
                utilization=fields.get("utilization"),
                memory_used_mib=used,
                memory_total_mib=used + free if used is not None and free is not None else None,
                power_w=fields.get("power_w"),
                temperature_c=fields.get("temperature_c"),
                host=hosts.get((job_id, node, gpu), ""),
                xid=int(xid) if xid else None,
                ecc_dbe=int(fields["ecc_dbe"]) if fields.get("ecc_dbe") else None,
            )
        )
    return readings
