"""The job's GPU charts as the server builds them (jobs.metrics.job_figures): a line per
GPU up to eight, above that the mean with a min–max band (each GPU hidden until asked
for), nothing at all without readings, the GPU type's colour, and markers for pauses,
resumes and preemptions from the job's events and its status messages."""

from __future__ import annotations

import json
from datetime import timedelta

import plotly.graph_objects as go
import pytest
from django.utils import timezone

from console.charts import PER_GPU_LINES_MAX, has_points
from jobs import metrics, realtime
from jobs.backends.base import GpuReading
from jobs.models import JobStatus
from marketplace.selectors import gpu_type_colours
from tests.conftest import signed_in_client
from tests.jobs.test_consumers import make_job
from tests.jobs_helpers import advance_to

pytestmark = pytest.mark.django_db


def samples_of(nodes: int, gpus: int, ticks: int) -> list[dict]:
    """Readings as the API lists them: each tick, every GPU of every node; GPU g on node n
    at tick t reads 10·n + g + t (so min, max and mean per tick are known)."""
    start = timezone.now() - timedelta(minutes=5)
    return [
        {
            "at": (start + timedelta(seconds=15 * t)).isoformat(),
            "node": f"rank {n}",
            "gpu": g,
            "utilization": float(10 * n + g + t),
            "memory_used_mib": 1000.0,
            "memory_total_mib": 81920.0,
            "power_w": None if g == 0 else 300.0,
            "temperature_c": 60.0,
        }
        for t in range(ticks)
        for n in range(nodes)
        for g in range(gpus)
    ]


def test_up_to_eight_gpus_get_a_line_each_in_colours_of_their_own():
    figures = metrics.job_figures(samples_of(1, PER_GPU_LINES_MAX, 3))
    for figure in figures.values():
        go.Figure(figure)  # valid plotly.js JSON
        assert figure["layout"]["meta"]["aggregate"] is False
        lines = figure["data"]
        assert len(lines) == PER_GPU_LINES_MAX and all(t["visible"] for t in lines)
        assert len({t["line"]["color"] for t in lines}) == PER_GPU_LINES_MAX
    assert [t["meta"] for t in figures["utilization"]["data"]][:2] == ["rank 0/gpu0", "rank 0/gpu1"]


def test_sixteen_gpus_are_a_mean_with_a_min_max_band_and_each_gpu_on_demand():
    samples = samples_of(2, 8, 3)
    figures = metrics.job_figures(samples, colour="#e69f00")
    utilisation = figures["utilization"]
    go.Figure(utilisation)
    low, high, mean, *per_gpu = utilisation["data"]
    assert [low["meta"], high["meta"], mean["meta"]] == list(metrics.AGGREGATE_KEYS)
    # GPU g of node n reads 10n + g + t: lowest 0 + t, highest 17 + t, mean 8.5 + t.
    assert low["y"] == [0.0, 1.0, 2.0]
    assert high["y"] == [17.0, 18.0, 19.0]
    assert mean["y"] == [8.5, 9.5, 10.5]
    assert high["fill"] == "tonexty" and mean["line"]["color"] == "#e69f00"
    assert mean["name"] == "Mean of 16 GPUs"
    assert utilisation["layout"]["meta"] == {"aggregate": True, "gpus": 16, "unit": "%"}
    # Each GPU is there, hidden until asked for, none drawn like another.
    assert len(per_gpu) == 16 and not any(t["visible"] for t in per_gpu)
    assert len({(t["line"]["color"], t["line"]["dash"]) for t in per_gpu}) == 16
    # Missing readings are left out of the band, not read as 0.
    power_low = figures["power_w"]["data"][0]
    assert power_low["y"] == [300.0, 300.0, 300.0]


def test_no_readings_draw_nothing():
    figures = metrics.job_figures([])
    assert all(figure["data"] == [] for figure in figures.values())
    assert not any(has_points(figure) for figure in figures.values())


def test_pauses_resumes_and_preemptions_are_marked_from_events_and_status_messages(
    world, other_world, catalog
):
    job = make_job(
        world.tenant,
        name="marked",
        gpu_type=catalog.gpu("a100-80gb"),
        gpus_per_node=8,
        nodes=2,
        backend="kubernetes",
    )
    started = timezone.now() - timedelta(seconds=1)
    advance_to(job, JobStatus.PAUSED)
    paused_message = realtime.job_status_message(job)
    advance_to(job, JobStatus.RUNNING)
    advance_to(job, JobStatus.PREEMPTED)
    assert paused_message["marker"] == "Paused"
    assert realtime.job_status_message(job)["marker"] == "Preempted"

    markers = metrics.job_markers(job=job, since=started)
    assert [m["label"] for m in markers] == ["Paused", "Resumed", "Preempted"]
    assert markers[0]["at"] == paused_message["at"]  # the page draws each change once
    assert metrics.job_markers(job=job, since=timezone.now() + timedelta(seconds=1)) == []

    metrics.metrics_record(
        job=job,
        at=timezone.now(),
        readings=[
            GpuReading(node=f"rank {n}", gpu=g, utilization=50.0, memory_used_mib=1.0)
            for n in range(2)
            for g in range(8)
        ],
    )
    body = signed_in_client(world.viewer, world.tenant).get(
        f"/api/v1/jobs/{job.pk}/metrics", {"since": started.isoformat()}
    )
    assert body.status_code == 200
    data = body.json()
    assert [m["label"] for m in data["markers"]] == ["Paused", "Resumed", "Preempted"]
    layout = data["figures"]["utilization"]["layout"]
    assert [a["text"] for a in layout["annotations"]] == ["Paused", "Resumed", "Preempted"]
    assert [s["x0"] for s in layout["shapes"]] == [m["at"] for m in data["markers"]]
    # The band is in the job's GPU type's colour, the one every page gives it.
    mean = data["figures"]["utilization"]["data"][2]
    assert mean["line"]["color"] == gpu_type_colours()["a100-80gb"]
    json.dumps(data["figures"])
    outsider = signed_in_client(other_world.owner, other_world.tenant)
    assert outsider.get(f"/api/v1/jobs/{job.pk}/metrics").status_code == 404


def test_each_chart_on_the_job_page_has_a_table_view(world, catalog):
    job = make_job(world.tenant, name="tables", gpus_per_node=1, backend="kubernetes")
    html = signed_in_client(world.viewer, world.tenant).get(f"/jobs/{job.pk}/").content.decode()
    assert html.count("data-chart-table-toggle") == len(metrics.CHARTS)
    for field, title, _unit in metrics.CHARTS:
        assert f'data-chart="{field}"' in html and f'data-caption="{title}"' in html
    assert "data-per-gpu" in html
