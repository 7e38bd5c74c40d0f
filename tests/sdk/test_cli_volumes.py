"""`gpugeek launch --volume NAME:/PATH[:ro]` against the real server."""

from __future__ import annotations

import json

import pytest
from gpugeek.cli import main
from gpugeek.errors import ValidationError
from gpugeek.spec import parse_volume

from jobs.models import Job
from jobs.services import spec_from_job
from tests.factories import VolumeFactory

pytestmark = pytest.mark.integration


def test_parse_volume():
    assert parse_volume("data:/data") == {"name": "data", "path": "/data", "read_only": False}
    assert parse_volume("data:/mnt/in:ro") == {"name": "data", "path": "/mnt/in", "read_only": True}
    assert parse_volume("data:/x:rw")["read_only"] is False
    for bad in ("data", "data:", "data:rel", ":/data"):
        with pytest.raises(ValidationError):
            parse_volume(bad)


@pytest.fixture
def cli(gg, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_launch_mounts_volumes_and_a_held_one_is_a_conflict(cli, world):
    VolumeFactory(tenant=world.tenant, name="data")
    VolumeFactory(tenant=world.tenant, name="weights")
    args = ("--json", "launch", "--image", "python-3.11", "--region", "local", "--cpus", "1",
            "--volume", "data:/data", "--volume", "weights:/weights:ro", "--", "true")  # fmt: skip
    code, out, err = cli(*args)
    assert code == 0, err
    job = Job.objects.get(pk=json.loads(out)["id"])
    assert spec_from_job(job).volumes == [
        {"name": "data", "path": "/data", "read_only": False},
        {"name": "weights", "path": "/weights", "read_only": True},
    ]
    code, _, err = cli(*args)
    assert code != 0 and f"#{job.pk}" in json.loads(err)["detail"]
    code, _, err = cli("launch", "--image", "python-3.11", "--volume", "data", "--", "true")
    assert code != 0 and "NAME:/PATH" in err
