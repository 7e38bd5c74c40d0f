"""One node limit (marketplace.pricing.MAX_NODES) for the estimate (page, API, service),
the launch (form, API, job spec) and the SDK and CLI, which refuse before sending: the
estimate used to allow 512 nodes (its API 4,096) and the launch form 1,024."""

from __future__ import annotations

import gpugeek.spec
import pytest
from gpugeek.cli import main
from gpugeek.errors import ValidationError
from gpugeek.spec import job_payload

from console.service_errors import ServiceError
from jobs.api.serializers import JobCreateSerializer
from jobs.forms import LaunchForm
from jobs.services.spec import JobSpec, spec_validate
from marketplace.api.serializers import EstimateRequestSerializer
from marketplace.forms import EstimateForm
from marketplace.models import Region
from marketplace.pricing import MAX_NODES, PricingError, estimate_cost
from tests.conftest import token_client

CPU = {"image": "python-3.11", "region": "us-west", "cpus": 1, "command": "true"}


def test_the_sdk_copy_is_the_servers_limit():
    assert gpugeek.spec.MAX_NODES == MAX_NODES == 1024
    for field in (
        EstimateForm.base_fields["nodes"],
        LaunchForm.base_fields["nodes"],
        EstimateRequestSerializer().fields["nodes"],
        JobCreateSerializer().fields["nodes"],
    ):
        assert field.max_value == MAX_NODES, field


def test_the_estimate_form_and_service_refuse_one_more(catalog, world):
    estimate = {
        "nodes": MAX_NODES + 1,
        "region": "us-west",
        "cpus": 8,
        "spot_ratio": "0",
        "hours": 1,
    }
    form = EstimateForm(data={**estimate, "tier": "on_demand"})
    assert not form.is_valid() and "nodes" in form.errors
    assert EstimateForm(data={**estimate, "nodes": MAX_NODES, "tier": "on_demand"}).is_valid()
    with pytest.raises(PricingError, match="at most 1,024 nodes"):
        estimate_cost(
            gpu_type=None, region=Region.objects.get(slug="us-west"), nodes=MAX_NODES + 1, cpus=8
        )
    assert (
        estimate_cost(
            gpu_type=None, region=Region.objects.get(slug="us-west"), nodes=MAX_NODES, cpus=8
        ).hourly
        > 0
    )


def test_the_api_refuses_one_more_node_for_an_estimate_and_a_launch(catalog, world):
    api = token_client(world.member, world.tenant)
    body = {"nodes": MAX_NODES + 1, "region": "us-west", "cpus": 8}
    refused = api.post("/api/v1/estimates", body, format="json")
    assert refused.status_code == 400 and "nodes" in refused.json()
    allowed = api.post("/api/v1/estimates", {**body, "nodes": MAX_NODES}, format="json")
    assert allowed.status_code == 200, allowed.content
    launch = api.post("/api/v1/jobs", {**CPU, "command": ["true"], "nodes": MAX_NODES + 1},
                      format="json")  # fmt: skip
    assert launch.status_code == 400 and "nodes" in launch.json()


def test_the_job_spec_refuses_one_more(catalog, world):
    spec = JobSpec(name="big", image="python-3.11", command=["true"], cpus=1,
                   region="us-west", nodes=MAX_NODES + 1)  # fmt: skip
    with pytest.raises(ServiceError, match="at most 1,024 nodes") as refused:
        spec_validate(tenant=world.tenant, spec=spec)
    assert refused.value.field == "nodes"


def test_the_sdk_and_cli_refuse_before_sending(tmp_path, monkeypatch, capsys):
    with pytest.raises(ValidationError, match="At most 1,024 nodes") as refused:
        job_payload(None, {**CPU, "nodes": MAX_NODES + 1})
    assert list(refused.value.errors) == ["nodes"]
    assert job_payload(None, {**CPU, "nodes": MAX_NODES})["nodes"] == MAX_NODES

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("GPUGEEK_URL", "http://127.0.0.1:1")  # never reached
    monkeypatch.setenv("GPUGEEK_TOKEN", "ggt_unused")
    code = main(["launch", "--image", "python-3.11", "--region", "us-west", "--cpus", "1",
                 "--nodes", str(MAX_NODES + 1), "--", "true"])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "At most 1,024 nodes" in err and "Traceback" not in err
    code = main(["estimate", "--cpus", "8", "--region", "us-west",
                 "--nodes", str(MAX_NODES + 1)])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "At most 1,024 nodes" in err
