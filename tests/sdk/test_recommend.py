"""The GPU recommender from the SDK (`gg.recommend`, `gpugeek.recommend`) and the CLI
(`gpugeek recommend 7b …`), against the real server and the demo catalog."""

from __future__ import annotations

import json
from decimal import Decimal

import gpugeek
import pytest
from gpugeek import GpuOption, Recommendation, ValidationError
from gpugeek.cli import main, parameters_billion

pytestmark = pytest.mark.integration


def test_recommend_returns_typed_options_cheapest_fitting_first(gg):
    result = gg.recommend(
        7, workload="full_finetune", precision="bf16", sequence_length=4096, batch_size=8
    )

    assert isinstance(result, Recommendation)
    assert 104 < result.memory_needed_gib < 160 / 1.2
    assert result.memory_margin == 0.2
    assert set(result.breakdown) == {
        "weights", "gradients", "optimizer", "activations", "kv_cache",
    }  # fmt: skip
    assert result.model["layers"] == 33
    assert result.options and all(isinstance(o, GpuOption) for o in result.options)
    h100 = next(o for o in result.options if o.gpu_type == "h100-80gb")
    assert (h100.gpus, h100.nodes, h100.fits) == (2, 1, True)
    prices = [Decimal(o.price_per_hour) for o in result.options if o.fits]
    assert prices == sorted(prices)


def test_module_level_recommend_uses_the_default_client(gg):
    result = gpugeek.recommend(7, workload="inference", precision="int8", sequence_length=4096)

    first = result.options[0]
    assert (first.gpu_type, first.gpus, first.gpu_memory_gib) == ("l4", 1, 24)


def test_bad_input_raises_validation_error_naming_the_field(gg):
    with pytest.raises(ValidationError) as refused:
        gg.recommend(-7, workload="lora")
    assert "parameters_billion" in refused.value.errors
    with pytest.raises(ValidationError) as refused:
        gg.recommend(7, workload="full_finetune", precision="int4")
    assert "precision" in refused.value.errors


@pytest.mark.parametrize(
    ("size", "billions"),
    [("7b", "7"), ("70B", "70"), ("1.5b", "1.5"), ("350m", "0.35"), ("1t", "1000"), ("13", "13")],
)
def test_sizes_read_as_billions(size, billions):
    assert parameters_billion(size) == billions


@pytest.fixture
def cli(gg, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_cli_prints_the_need_and_a_table(cli):
    code, out, _ = cli("recommend", "70b", "--workload", "lora", "--precision", "bf16")

    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("GPU memory needed: ") and "GiB" in lines[0]
    assert "weights" in lines[0]
    assert lines[1].startswith("With the 20% margin: ")
    assert lines[2].split()[:3] == ["GPU_TYPE", "GPUS", "NODES"]
    rows = [line.split() for line in lines[3:]]
    eighty = [row for row in rows if row[0] in ("a100-80gb", "h100-80gb")]
    assert eighty and all(int(row[1]) >= 2 for row in eighty)


def test_cli_json_and_refusals(cli):
    code, out, _ = cli("--json", "recommend", "7b", "--workload", "qlora", "--precision", "int4")
    assert code == 0
    body = json.loads(out)
    assert body["options"] and body["breakdown"]["weights"] > 0

    code, _, err = cli("recommend", "seven", "--workload", "lora")
    assert code == 2 and "size" in err
    code, _, err = cli("recommend", "0b", "--workload", "lora")
    assert code == 1 and "parameters_billion" in err
