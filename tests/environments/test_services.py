"""Pure rules of environments: the idle policy's validation and defaults, and the
environment status each job status maps to (the one place that decides it)."""

from __future__ import annotations

import pytest

from console.service_errors import ServiceError
from environments import sshd
from environments.models import EnvironmentStatus
from environments.services import IDLE_POLICY_DEFAULTS, idle_policy_validate, status_for_job
from jobs.backends.local_sandbox import INNER_USER, WORKSPACE
from jobs.models import Job, JobStatus


def test_idle_policy_defaults_and_bounds():
    assert idle_policy_validate(None) == IDLE_POLICY_DEFAULTS
    assert idle_policy_validate({"idle_minutes": 30})["idle_minutes"] == 30
    for bad in ({"idle_minutes": "60"}, {"idle_minutes": True}, {"gpu_busy_percent": 101},
                {"warning_minutes": 60, "idle_minutes": 60}, {"x": 1}, []):  # fmt: skip
        with pytest.raises(ServiceError) as refused:
            idle_policy_validate(bad)
        assert refused.value.field == "idle_policy"


@pytest.mark.parametrize(
    ("job_status", "expected"),
    [
        (JobStatus.QUEUED, EnvironmentStatus.STARTING),
        (JobStatus.PREEMPTED, EnvironmentStatus.STARTING),
        (JobStatus.RUNNING, EnvironmentStatus.RUNNING),
        (JobStatus.CANCELLING, EnvironmentStatus.STOPPING),
        (JobStatus.PAUSED, EnvironmentStatus.STOPPED),
        (JobStatus.CANCELLED, EnvironmentStatus.STOPPED),
        (JobStatus.SUCCEEDED, EnvironmentStatus.STOPPED),
        (JobStatus.FAILED, EnvironmentStatus.FAILED),
    ],
)
def test_status_follows_the_job(job_status, expected):
    assert status_for_job(Job(status=job_status, status_reason="why"))[0] == expected
    assert status_for_job(None) == (EnvironmentStatus.STOPPED, "")


def test_every_job_status_has_an_environment_status():
    for job_status in JobStatus.values:
        status_for_job(Job(status=job_status))


def test_sshd_logs_in_the_sandbox_user_at_its_home():
    # An unprivileged sshd logs in only the user it runs as: the sandbox's.
    assert (sshd.SSH_USER, sshd.HOME_PATH) == (INNER_USER, WORKSPACE)
    command = sshd.environment_command(authorized_keys="ssh-ed25519 AAAA x\n")
    assert command[:2] == ["/bin/sh", "-c"] and command[4] == "ssh-ed25519 AAAA x\n"
    config = command[5].splitlines()
    assert f"ListenAddress 0.0.0.0:{sshd.SSHD_PORT}" in config
    for line in ("PasswordAuthentication no", "KbdInteractiveAuthentication no"):
        assert line in config
