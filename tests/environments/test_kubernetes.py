"""Environments on a Kubernetes cluster (the sandbox's API server, through the official
client): one starts as a job whose pod the console's gateways reach at its IP on the
ports it declares (its NetworkPolicy admits the console's web and SSH-gateway pods only),
which is where the SSH gateway and the Jupyter proxy dial; the image serves sshd itself.
Keys added or removed while it runs go into the job's ConfigMap, which its pod mounts
read-only where sshd reads them (the kubelet syncs it into the running pod)."""

from __future__ import annotations

import pytest

from console.services.ssh_keys import ssh_key_add, ssh_key_delete
from environments import selectors, services, sshd
from environments.models import EnvironmentStatus
from environments.services.keys import environment_keys_publish
from jobs import services as job_services
from jobs.backends import get_backend
from jobs.backends.base import PUBLISHED_MOUNT
from jobs.models import JobStatus
from marketplace.models import Image, ImageInteractive
from tests.environments.test_api import with_key
from tests.factories import ed25519_public_key_line
from tests.jobs.test_kubernetes_lifecycle import cluster, live_pods, ns, settle  # noqa: F401


@pytest.fixture
def ssh_image():
    Image.objects.filter(slug="python-3.11").update(interactive=ImageInteractive.SSH)
    return "python-3.11"


def started_box(world, image: str):
    """The member's environment `box` on the cluster, started (its job not yet dispatched)."""
    with_key(world.member)
    environment = services.environment_create(
        tenant=world.tenant, user=world.member, name="box", region="us-west", image=image, cpus=1
    )
    return services.environment_start(environment=environment, user=world.member)


def test_an_environment_on_the_cluster_is_reached_at_its_pod(world, cluster, ssh_image):  # noqa: F811
    environment = started_box(world, ssh_image)
    cluster.pod_start_delay = 60  # (its pod is not running until the check below says so)
    job = job_services.job_dispatch(job=environment.current_job)  # what the task does
    assert job.backend == "kubernetes"
    assert selectors.environment_port_address(environment=environment) is None  # not yet
    cluster.pod_start_delay = 0
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


def test_keys_changed_while_it_runs_reach_its_pod_through_a_config_map(
    world,
    cluster,  # noqa: F811
    ssh_image,
):
    environment = started_box(world, ssh_image)
    job = settle(cluster, job_services.job_dispatch(job=environment.current_job), JobStatus.RUNNING)
    (pod,) = live_pods(cluster, job)
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "published", "mountPath": PUBLISHED_MOUNT, "readOnly": True} in mounts
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "published")
    assert volume["configMap"] == {"name": f"gg-{job.pk}-files", "optional": True}
    assert cluster.get("configmaps", ns(job), f"gg-{job.pk}-files") is None  # nothing yet

    def published() -> str:
        config_map = cluster.get("configmaps", ns(job), f"gg-{job.pk}-files")
        return config_map["data"][sshd.PUBLISHED_KEYS]

    laptop = ssh_key_add(user=world.member, public_key=ed25519_public_key_line())
    environment.refresh_from_db()
    assert environment_keys_publish(environment=environment)  # (the task queued on commit)
    assert laptop.public_key.split()[1] in published()
    ssh_key_delete(key=laptop)
    assert environment_keys_publish(environment=environment)
    assert laptop.public_key.split()[1] not in published()
    # It goes with the job's other objects.
    get_backend(job.backend).release(job)
    assert cluster.get("configmaps", ns(job), f"gg-{job.pk}-files") is None
