"""Ports to expose (Jupyter, SSH): validated at launch, carried into the pod spec."""

import pytest

from jobs.backends.kubernetes import manifests
from jobs.services import JobSpec, job_submit
from tests.conftest import token_client

BAD_PORTS = [
    [{"name": "Jupyter", "port": 8888}],  # upper case
    [{"name": "jupyter", "port": 70000}],
    [{"name": "jupyter", "port": "8888"}],
    [{"name": "a", "port": 22}, {"name": "a", "port": 23}],
    [{"name": "x", "port": 29500}],  # the rendezvous port
    [{"name": "jupyter", "port": 8888, "extra": 1}],
]


@pytest.mark.parametrize("ports", BAD_PORTS)
def test_bad_ports_are_a_400_with_the_field(world, catalog, ports):
    response = token_client(world.member, world.tenant).post(
        "/api/v1/jobs",
        {
            "name": "p",
            "image": "python-3.11",
            "command": ["true"],
            "cpus": 1,
            "ports": ports,
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    assert "ports" in response.json()


def test_ports_reach_the_container_and_the_service(world, catalog):
    job = job_submit(
        tenant=world.tenant,
        user=world.member,
        spec=JobSpec(
            name="notebook",
            image="python-3.11",
            command=["jupyter", "lab"],
            cpus=1,
            ports=[{"name": "jupyter", "port": 8888}, {"name": "ssh", "port": 2222}],
        ),
    )
    service = manifests.service_manifest(job)
    assert {"name": "jupyter", "port": 8888, "protocol": "TCP"} in service["spec"]["ports"]
    assert {"name": "ssh", "port": 2222, "protocol": "TCP"} in service["spec"]["ports"]
    (job_manifest,) = manifests.job_manifests(job)
    container = job_manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [
        {"name": "jupyter", "containerPort": 8888, "protocol": "TCP"},
        {"name": "ssh", "containerPort": 2222, "protocol": "TCP"},
    ]
