"""Per-job scoped store credentials, against moto's server over HTTP (S3 and STS):
with CHECKPOINT_STORE_STS a job gets temporary credentials whose session policy allows
only its own prefix; without it, the installation's job credentials; never the console's
own. A job whose console URL its SDK accepts renews them at the console (the AWS SDKs'
container-credentials protocol) instead of holding keys that expire. moto records an
AssumeRole's session policy but does not enforce session policies, so the policy is
checked as moto received it, and the credentials by using them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime

import pytest
from botocore.credentials import ContainerProvider
from django.core.cache import cache
from django.utils import timezone
from moto.sts.models import sts_backends

from jobs.backends.kubernetes.manifests.workload import checkpoint_secret_values, job_manifest
from jobs.backends.local_checkpoints import checkpoint_environment
from jobs.checkpoints.store import checkpoint_store
from jobs.models import JobStatus
from jobs.selectors import job_isolation_note
from jobs.services.checkpoints import job_checkpoint_record, job_store_prefix
from sandbox import checkpoints as simulated
from tests.factories import JobFactory
from tests.jobs.test_checkpoints import SRC, _free_port, s3_endpoint, sdk  # noqa: F401
from tests.jobs_helpers import advance_to

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


# --- Renewal: a job running longer than one set of credentials lasts ---------------------

RENEWAL_PATH = "/api/v1/jobs/{}/checkpoint-credentials"


def job_only_environment(env: dict[str, str]) -> dict[str, str]:
    """What a job's process has: its own variables, none of the console's (no AWS_* keys,
    no settings), plus what runs Python and the SDK (installed in the job's image)."""
    return {**env, "PATH": os.environ["PATH"], "HOME": "/nonexistent", "PYTHONPATH": str(SRC)}


@pytest.mark.django_db(transaction=True)
def test_a_job_renews_its_credentials_at_the_console_through_the_aws_sdk(
    s3_store, settings, live_server, tmp_path
):
    settings.CHECKPOINT_STORE_STS_SECONDS = 900  # within the SDKs' 15-minute renewal window
    settings.CONSOLE_URL_FOR_JOBS = live_server.url
    job = JobFactory()
    advance_to(job, JobStatus.RUNNING)
    env = checkpoint_environment(job, sandboxed=False)
    # No keys that expire in its environment: the SDK's container provider fetches them.
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
    assert env["AWS_CONTAINER_CREDENTIALS_FULL_URI"] == (
        live_server.url + RENEWAL_PATH.format(job.pk)
    )
    token = env["AWS_CONTAINER_AUTHORIZATION_TOKEN"]
    assert token == f"Bearer {env['GPUGEEK_CHECKPOINT_TOKEN']}"

    # The job's own process saves through the helper with boto3's default chain.
    (tmp_path / "model.pt").write_bytes(b"w" * 8)
    script = (
        f"from gpugeek import checkpoint; checkpoint.save([{str(tmp_path / 'model.pt')!r}], step=7)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=job_only_environment(env),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert job_checkpoint_record(job=job).latest.step == 7
    # So does the sandbox's simulated workload, with the pod's environment only.
    simulated.save(env["GPUGEEK_CHECKPOINT_URL"], env, step=8, rank=0, loss=0.5)
    assert job_checkpoint_record(job=job).latest.step == 8

    # Renewal: once the console's set is replaced, the SDK's next use fetches the new one.
    provider = ContainerProvider(environ=env)
    credentials = provider.load()
    first = credentials.get_frozen_credentials()
    assert first.access_key != "console-key" and first.token
    cache.clear()
    renewed = credentials.get_frozen_credentials()
    assert renewed.access_key != first.access_key
    assert recorded_policies()[-1]["Statement"][0]["Resource"].endswith(
        f"/base/{job_store_prefix(job)}*"
    )


@pytest.mark.django_db
def test_renewal_answers_only_the_jobs_own_token_while_it_runs(s3_store, settings, client):
    settings.CONSOLE_URL_FOR_JOBS = "https://console.example"
    job = JobFactory()
    advance_to(job, JobStatus.RUNNING)
    theirs = JobFactory()  # another tenant's job
    advance_to(theirs, JobStatus.RUNNING)
    assert theirs.tenant_id != job.tenant_id
    env = checkpoint_environment(job, sandboxed=False)
    token = env["AWS_CONTAINER_AUTHORIZATION_TOKEN"]

    def ask(job_id: int, authorization: str | None = token):
        headers = {"HTTP_AUTHORIZATION": authorization} if authorization else {}
        return client.get(RENEWAL_PATH.format(job_id), **headers)

    answer = ask(job.pk)
    assert answer.status_code == 200
    body = answer.json()
    assert set(body) == {"AccessKeyId", "SecretAccessKey", "Token", "Expiration"}
    assert body["AccessKeyId"] != "console-key"
    assert datetime.fromisoformat(body["Expiration"]) > timezone.now()

    assert ask(job.pk, None).status_code == 401
    assert ask(job.pk, "Bearer forged").status_code == 404
    # Its token names its job only: another tenant's job is 404, as one that doesn't exist.
    assert ask(theirs.pk).status_code == 404
    assert ask(theirs.pk).json()["code"] == "not_found"
    assert ask(job.pk + 10_000).status_code == 404

    advance_to(job, JobStatus.SUCCEEDED)
    finished = ask(job.pk)
    assert finished.status_code == 409 and "finished" in finished.json()["detail"]

    settings.CHECKPOINT_STORE_STS = False  # keys that don't expire: nothing to renew
    other = JobFactory(tenant=job.tenant)
    advance_to(other, JobStatus.RUNNING)
    env = checkpoint_environment(other, sandboxed=False)
    assert "AWS_CONTAINER_CREDENTIALS_FULL_URI" not in env
    unrenewable = ask(other.pk, f"Bearer {env['GPUGEEK_CHECKPOINT_TOKEN']}")
    assert unrenewable.status_code == 409
    assert "no temporary credentials" in unrenewable.json()["detail"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("console_url", "renewed"),
    [
        ("https://console.example", True),
        ("http://127.0.0.1:8000", True),
        ("http://localhost:8000", True),
        # Plain HTTP elsewhere: AWS SDKs refuse to fetch credentials from it, so the job
        # gets its keys in the environment (renewed at each start) instead.
        ("http://console.internal:8000", False),
        ("", False),
    ],
)
def test_the_renewal_url_only_where_aws_sdks_fetch_from_it(
    s3_store, settings, console_url, renewed
):
    settings.CONSOLE_URL_FOR_JOBS = console_url
    env = checkpoint_environment(JobFactory(), sandboxed=False)
    assert ("AWS_CONTAINER_CREDENTIALS_FULL_URI" in env) is renewed
    assert ("AWS_SESSION_TOKEN" in env) is not renewed


@pytest.mark.django_db
def test_on_kubernetes_the_renewal_token_is_in_the_jobs_secret_not_its_object(s3_store, settings):
    settings.CONSOLE_URL_FOR_JOBS = "https://console.example"
    job = JobFactory()
    manifest = job_manifest(job, "on_demand", 1, 0)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    env = {entry["name"]: entry for entry in container["env"]}
    assert env["AWS_CONTAINER_CREDENTIALS_FULL_URI"]["value"] == (
        "https://console.example" + RENEWAL_PATH.format(job.pk)
    )
    token = env["AWS_CONTAINER_AUTHORIZATION_TOKEN"]
    assert "value" not in token  # never in the Job object itself
    assert token["valueFrom"]["secretKeyRef"]["key"] == "AWS_CONTAINER_AUTHORIZATION_TOKEN"
    assert "AWS_SESSION_TOKEN" not in env
    secret = checkpoint_secret_values(job)
    assert secret["AWS_CONTAINER_AUTHORIZATION_TOKEN"].startswith("Bearer ")
    assert "AWS_CONTAINER_CREDENTIALS_FULL_URI" not in secret
