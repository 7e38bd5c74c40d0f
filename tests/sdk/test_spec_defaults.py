"""What the SDK and CLI fill in or refuse before anything is sent: a command string that
doesn't split, the job's default name, and the one max-runtime default."""

from __future__ import annotations

import json
import re

import pytest
from gpugeek.cli import main
from gpugeek.errors import ValidationError
from gpugeek.spec import job_payload

from jobs.api.serializers import JobCreateSerializer
from jobs.forms import LaunchForm
from jobs.services.spec import DEFAULT_MAX_RUNTIME_MINUTES, JobSpec

CPU = {"image": "python-3.11", "region": "local", "cpus": 1}


def test_an_unbalanced_quote_is_a_clear_validation_error():
    with pytest.raises(ValidationError) as refused:
        job_payload(None, {**CPU, "command": "python -c 'print(1)"})
    assert "no closing quotation" in str(refused.value)
    assert list(refused.value.errors) == ["command"]


def test_the_cli_says_so_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("GPUGEEK_URL", "http://127.0.0.1:1")  # never reached
    monkeypatch.setenv("GPUGEEK_TOKEN", "ggt_unused")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**CPU, "command": 'echo "unbalanced'}))
    code = main(["launch", "-f", str(spec)])
    err = capsys.readouterr().err
    assert code != 0
    assert "ValidationError" in err and "no closing quotation" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("command", "image", "stem"),
    [
        (["torchrun", "--nproc-per-node", "8", "train.py"], "pytorch-2-5-cuda12-4", "train-py"),
        (["python", "-c", "print(1)"], "python-3.11", "python"),
        ("bash 'scripts/Run Me.sh'", "ubuntu", "run-me-sh"),
        ([], "pytorch-2-5-cuda12-4", "pytorch-2-5-cuda12-4"),
    ],
)
def test_a_job_without_a_name_is_named_after_what_it_runs(command, image, stem):
    spec = {**CPU, "image": image, "command": command}
    first, second = (job_payload(None, spec)["name"] for _ in range(2))
    assert re.fullmatch(rf"{re.escape(stem)}-[0-9a-f]{{6}}", first), first
    assert first != second  # two launches are told apart
    assert job_payload(None, {**spec, "name": "mine"})["name"] == "mine"


def test_one_max_runtime_default_for_form_api_sdk_and_cli(db):
    assert JobSpec.max_runtime_minutes == DEFAULT_MAX_RUNTIME_MINUTES == 24 * 60
    serializer_field = JobCreateSerializer().fields["max_runtime_minutes"]
    assert serializer_field.default == DEFAULT_MAX_RUNTIME_MINUTES
    assert LaunchForm.base_fields["max_runtime_minutes"].initial == DEFAULT_MAX_RUNTIME_MINUTES
    # The SDK and CLI send none, so the API's default applies.
    assert "max_runtime_minutes" not in job_payload(None, {**CPU, "command": "python x.py"})
