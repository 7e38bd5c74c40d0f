"""Environments on a Kubernetes cluster (the sandbox's API server, through the official
client): one starts as a job whose pod the console's gateways reach at its IP on the
ports it declares (its NetworkPolicy admits the console's web and SSH-gateway pods only),
which is where the SSH gateway and the Jupyter proxy dial; the image serves sshd itself."""

from __future__ import annotations

import pytest

from environments import selectors, services, sshd
from environments.models import EnvironmentStatus
from jobs import services as job_services
from jobs.models import JobStatus
from marketplace.models import Image, ImageInteractive
from tests.environments.test_api import with_key
from tests.jobs.test_kubernetes_lifecycle import cluster, live_pods, ns, settle  # noqa: F401


@pytest.fixture
def ssh_image():
    Image.objects.filter(slug="python-3.11").update(interactive=ImageInteractive.SSH)
    return "python-3.11"


def test_an_environment_on_the_cluster_is_reached_at_its_pod(world, cluster, ssh_image):  # noqa: F811
    with_key(world.member)
    environment = services.environment_create(
        tenant=world.tenant,
        user=world.member,
        name="box",
        region="us-west",
        image=ssh_image,
        cpus=1,
    )
    environment = services.environment_start(environment=environment, user=world.member)
    job = job_services.job_dispatch(job=environment.current_job)  # what the task does
    assert job.backend == "kubernetes"
    assert selectors.environment_port_address(environment=environment) is None  # not yet
    job = settle(cluster, job, JobStatus.RUNNING)
    environment.refresh_from_db()
    services.environment_sync(environment=environment)
    assert environment.status == EnvironmentStatus.RUNNING
    (pod,) = live_pods(cluster, job)
    address = selectors.environment_port_address(environment=environment)
    assert address == (pod["status"]["podIP"], sshd.SSHD_PORT)
    policy = cluster.get("networkpolicies", ns(job), f"gg-{job.pk}")
    assert policy["spec"]["ingress"][0]["ports"] == [{"protocol": "TCP", "port": sshd.SSHD_PORT}]
    # Its home volume is the claim the pod mounts read-write at /workspace.
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "vol-0", "mountPath": sshd.HOME_PATH, "readOnly": False} in mounts
