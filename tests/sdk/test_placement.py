"""The SDK and CLI's side of placement (issue 31): `requirements`, several acceptable
`regions` / `gpu_types` and `data_region` in a spec, checked and spelled before a
request as the server expects them, and a launch through the SDK that the server
places and explains."""

from __future__ import annotations

import gpugeek.spec
import pytest
from gpugeek.cli import _launch_spec, _parser
from gpugeek.errors import ValidationError
from gpugeek.models import GpuType
from gpugeek.spec import job_payload

from jobs.api.serializers import JobCreateSerializer
from jobs.models import JobEvent
from jobs.services.placement import REQUIREMENT_VALUES
from marketplace.models import NodePool

SPEC = {"name": "p", "image": "cuda-12-4-runtime", "command": ["true"]}


class Catalog:
    """What job_payload asks of a client to spell GPU types."""

    def gpu_types(self) -> list[GpuType]:
        return [
            GpuType.from_dict({"slug": slug, "model": model})
            for slug, model in (("h100-80gb", "H100 80GB SXM"), ("a100-80gb", "A100 80GB SXM"))
        ]


def test_the_sdk_copy_of_the_requirements_is_the_servers():
    assert gpugeek.spec.REQUIREMENT_VALUES == REQUIREMENT_VALUES
    fields = JobCreateSerializer().fields["requirements"].fields
    assert {name: tuple(fields[name].choices) for name in fields} == REQUIREMENT_VALUES


def test_lists_and_requirements_pass_through_spelled_as_the_server_expects():
    body = job_payload(
        Catalog(),
        {**SPEC, "gpu_types": ["H100-80GB", "a100 80gb sxm"], "regions": ["us-west", "eu-central"],
         "data_region": "eu-central", "requirements": {"interconnect": "nvlink"}},
    )  # fmt: skip
    assert body["gpu_types"] == ["h100-80gb", "a100-80gb"]
    assert body["gpus_per_node"] == 1  # a GPU job, as with gpu_type
    assert (body["regions"], body["data_region"], body["requirements"]) == (
        ["us-west", "eu-central"],
        "eu-central",
        {"interconnect": "nvlink"},
    )


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"requirements": {"interconnect": "wifi"}}, "requirements"),
        ({"requirements": {"gpu": "h100"}}, "requirements"),
        ({"gpu_types": ["h100-80gb"], "count": 8}, "count"),
    ],
)
def test_what_the_server_would_refuse_is_refused_before_sending(extra, field):
    with pytest.raises(ValidationError) as refused:
        job_payload(Catalog(), {**SPEC, **extra})
    assert list(refused.value.errors) == [field]


def test_the_cli_flags_make_the_same_spec():
    args = _parser().parse_args(
        ["launch", "--image", "cuda-12-4-runtime", "--gpu-types", "h100-80gb, a100-80gb",
         "--gpus-per-node", "8", "--regions", "us-west,eu-central", "--data-region",
         "eu-central", "--interconnect", "infiniband", "--cpu-arch", "amd64", "--", "true"]
    )  # fmt: skip
    spec = _launch_spec(args)
    assert spec["gpu_types"] == ["h100-80gb", "a100-80gb"]
    assert spec["regions"] == ["us-west", "eu-central"] and spec["data_region"] == "eu-central"
    assert spec["requirements"] == {"interconnect": "infiniband", "cpu_arch": "amd64"}
    with pytest.raises(SystemExit):  # not a documented value
        _parser().parse_args(["launch", "--interconnect", "wifi", "--", "true"])


@pytest.mark.integration
def test_a_launch_through_the_sdk_is_placed_and_says_how(gg):
    """This installation runs the local backend only: of "local" and "us-west" (whose
    pools are the demo catalog's Kubernetes ones) the job can only run here, and its
    timeline says why us-west was refused."""
    cpu = {"name": "placed", "image": "python-3.11", "cpus": 1, "command": ["true"]}
    with pytest.raises(ValidationError) as refused:
        gg.create_cluster({**cpu, "region": "local", "requirements": {"cpu_arch": "arm64"}})
    assert "requirements" in refused.value.errors
    NodePool.objects.filter(region__slug="local", gpu_type=None).update(cpu_arch="arm64")
    cluster = gg.create_cluster(
        {**cpu, "regions": ["local", "us-west"], "requirements": {"cpu_arch": "arm64"}}
    )
    assert cluster.job.region == "local"
    assert cluster.job.requirements == {"cpu_arch": "arm64"}
    (note,) = JobEvent.objects.filter(job_id=cluster.id, reason__startswith="Placement")
    assert "CPU in us-west: refused" in note.reason
    assert note.reason.endswith("Chosen: CPU in local.")
    cluster.cancel()
