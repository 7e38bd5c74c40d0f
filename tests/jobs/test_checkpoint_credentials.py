"""Per-job scoped store credentials, against moto's server over HTTP (S3 and STS):
with CHECKPOINT_STORE_STS a job gets temporary credentials whose session policy allows
only its own prefix; without it, the installation's job credentials; never the console's
own. moto records an AssumeRole's session policy but does not enforce session policies,
so the policy is checked as moto received it, and the credentials by using them."""

from __future__ import annotations

import json

import pytest
from moto.sts.models import sts_backends

from jobs.backends.local_checkpoints import checkpoint_environment
from jobs.checkpoints.store import checkpoint_store
from jobs.selectors import job_isolation_note
from jobs.services.checkpoints import job_checkpoint_record, job_store_prefix
from tests.factories import JobFactory
from tests.jobs.test_checkpoints import _free_port, s3_endpoint, sdk  # noqa: F401  (a fixture)

ROLE = "arn:aws:iam::123456789012:role/gpugeek-checkpoints"


@pytest.fixture
def s3_store(request, settings):
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"scoped-{_free_port()}"  # a bucket per test: its own cache keys too
    settings.CHECKPOINT_STORE_URL = f"s3://{bucket}/base"
    settings.CHECKPOINT_STORE_ENDPOINT = endpoint
    settings.CHECKPOINT_STORE_REGION = "us-east-1"
    settings.CHECKPOINT_STORE_ACCESS_KEY_ID = "console-key"
    settings.CHECKPOINT_STORE_SECRET_ACCESS_KEY = "console-secret"
    settings.CHECKPOINT_STORE_JOB_ACCESS_KEY_ID = ""
    settings.CHECKPOINT_STORE_JOB_SECRET_ACCESS_KEY = ""
    settings.CHECKPOINT_STORE_STS = True
    settings.CHECKPOINT_STORE_STS_ROLE_ARN = ROLE
    checkpoint_store().client.create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
    return bucket


def recorded_policies() -> list[dict]:
    roles = sts_backends["123456789012"]["aws"].assumed_roles
    return [json.loads(role.policy) for role in roles if role.policy]


@pytest.mark.django_db
def test_a_job_gets_sts_credentials_scoped_to_its_own_prefix(
    s3_store, settings, monkeypatch, tmp_path
):
    job = JobFactory()
    env = checkpoint_environment(job, sandboxed=False)
    assert env["AWS_SESSION_TOKEN"]
    assert env["AWS_ACCESS_KEY_ID"] != "console-key"
    assert "console-secret" not in env.values()
    prefix = f"base/{job.tenant_id}/{job.pk}/"
    assert recorded_policies()[-1] == {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": [
                    "s3:GetObject",
                    "s3:PutObject",
                    "s3:DeleteObject",
                    "s3:AbortMultipartUpload",
                    "s3:ListMultipartUploadParts",
                ],
                "Resource": f"arn:aws:s3:::{s3_store}/{prefix}*",
            },
            {
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": f"arn:aws:s3:::{s3_store}",
                "Condition": {"StringLike": {"s3:prefix": [f"{prefix}*"]}},
            },
        ],
    }
    # The job saves through the helper with exactly what it was handed.
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("AWS_ENDPOINT_URL", env["AWS_ENDPOINT_URL"])
    (tmp_path / "model.pt").write_bytes(b"w" * 8)
    sdk.save([tmp_path / "model.pt"], step=1, url=env["GPUGEEK_CHECKPOINT_URL"])
    assert job_checkpoint_record(job=job).latest.step == 1
    # Each job its own session and policy; the same job's renders reuse its credentials.
    count = len(recorded_policies())
    assert checkpoint_environment(job, sandboxed=False) == env
    other = JobFactory()
    other_env = checkpoint_environment(other, sandboxed=False)
    assert len(recorded_policies()) == count + 1
    assert other_env["AWS_ACCESS_KEY_ID"] != env["AWS_ACCESS_KEY_ID"]
    assert job_store_prefix(other) in recorded_policies()[-1]["Statement"][0]["Resource"]
    assert "limited to its own prefix" in job_isolation_note(job)


@pytest.mark.django_db
def test_federation_tokens_when_no_role_is_set(s3_store, settings):
    settings.CHECKPOINT_STORE_STS_ROLE_ARN = ""
    env = checkpoint_environment(JobFactory(), sandboxed=False)
    assert env["AWS_SESSION_TOKEN"] and env["AWS_ACCESS_KEY_ID"] != "console-key"


@pytest.mark.django_db
def test_without_sts_the_job_credentials_or_none_never_the_consoles(s3_store, settings):
    settings.CHECKPOINT_STORE_STS = False
    job = JobFactory()
    env = checkpoint_environment(job, sandboxed=False)
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
    assert "no checkpoint store credentials" in job_isolation_note(job)
    settings.CHECKPOINT_STORE_JOB_ACCESS_KEY_ID = "job-key"
    settings.CHECKPOINT_STORE_JOB_SECRET_ACCESS_KEY = "job-secret"
    env = checkpoint_environment(job, sandboxed=False)
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("job-key", "job-secret")
    assert "AWS_SESSION_TOKEN" not in env
    assert "not limited to its own prefix" in job_isolation_note(job)
