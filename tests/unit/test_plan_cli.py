"""`servepilot plan` as a user runs it: JSON for programs, exit codes, errors without tracebacks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from servepilot.cli.main import main
from servepilot.core.config import load_config


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["plan", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_has_the_documented_keys_and_a_runnable_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(capsys, "--model", "deepseek-v3", "--accelerator", "h200", "--count", "8",
                       "--qps", "400", "--json")  # fmt: skip
    data = json.loads(out)
    assert code == 0 and data["fits"] is True
    assert {"tp", "ep", "dp", "pp"} <= set(data["layout"])
    command = data["vllm_command"]
    assert command.startswith("vllm serve deepseek-ai/DeepSeek-V3 ")
    assert "--tensor-parallel-size 8" in command and "--enable-expert-parallel" in command


@pytest.mark.parametrize("qps", [400, 5000])
def test_deepseek_v3_cost_and_advice_come_from_the_replicas_the_estimate_needs(
    capsys: pytest.CaptureFixture[str], qps: int
) -> None:
    code, out, _ = run(capsys, "--model", "deepseek-v3", "--accelerator", "h200", "--count", "8",
                       "--qps", str(qps), "--json")  # fmt: skip
    assert code == 0
    data = json.loads(out)
    per_replica = data["estimates"]["per_replica"]["capacity"]["request_throughput"]
    # TP8+EP8: one replica per node of 8 H200 at the catalog's $6.305 each.
    replicas = math.ceil(qps / per_replica)
    assert replicas > 1
    assert data["estimates"]["replicas_for_target"] == replicas
    assert data["cost"]["nodes_for_target"] == replicas
    assert data["cost"]["usd_per_hour"] == pytest.approx(8 * 6.305)
    assert data["cost"]["usd_per_qps"] == pytest.approx(replicas * 8 * 6.305 / qps, rel=1e-3)
    assert data["advice"]["deployment"] == "distributed"


def test_bursty_flag_reaches_the_advice(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--model", "llama-3.1-8b", "--accelerator", "h100", "--count", "8", "--qps", "50")
    _, out, _ = run(capsys, *args, "--json")
    assert json.loads(out)["advice"]["deployment"] == "single-node"
    _, out, _ = run(capsys, *args, "--bursty", "--json")
    assert json.loads(out)["advice"]["deployment"] == "single-node+autoscaling"


def test_not_fitting_exits_1_and_suggests_the_first_rung_that_fits(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_file = tmp_path / "fleet.yaml"
    code, out, err = run(capsys, "--model", "deepseek-v3", "--accelerator", "h100", "--count", "8",
                         "--json", "--out", str(out_file))  # fmt: skip
    data = json.loads(out)
    assert code == 1 and data["fits"] is False and data["vllm_command"] is None
    assert data["shortfall_bytes"] > 0
    suggested = data["suggested"]
    assert suggested["vllm_command"].startswith("vllm serve")
    # The fleet.yaml written is the suggested rung's, and it parses as a fleet config.
    config = load_config(out_file)
    assert config.engine.tensor_parallel_size == 8
    assert "after:" in err


def test_fleet_yaml_from_plan_is_read_back_by_plan_with_the_same_answer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_file = tmp_path / "fleet.yaml"
    code, first, _ = run(capsys, "--memory-gib", "1", "--max-model-len", "4096", "--json",
                         "--out", str(out_file))  # fmt: skip
    assert code == 0
    code, again, _ = run(capsys, "-c", str(out_file), "--json")
    assert code == 0

    def answer(text: str) -> dict[str, object]:
        data = json.loads(text)
        knobs = {name: knob["value"] for name, knob in data["knobs"].items()}
        return {"kv": data["kv_capacity_tokens"], "layout": data["layout"], "knobs": knobs}

    # Same numbers; the reasons now say "as configured".
    assert answer(again) == answer(first)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "no-such-model"], "unknown model 'no-such-model'"),
        (["--accelerator", "h900"], "did you mean `h200-141`"),
        (["--accelerator", "h100", "--count", "16"], "hardware.count 16"),
        (["--memory-gib", "-1"], "hardware.memory_gib"),
        (["--kv-dtype", "fp7"], "--kv-dtype: unknown KV cache format 'fp7'"),
        (["--model", "llama-3.1-8b", "--max-model-len", "1000000"], "max_position_embeddings"),
    ],
)
def test_bad_input_is_one_clear_error(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, _, err = run(capsys, *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_a_user_catalog_entry_is_planned_and_kept_in_the_fleet_yaml(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    catalog = tmp_path / "gpus.yaml"
    # An H100 with twice the memory: DeepSeek-V3 FP8 then fits on 8 of them.
    catalog.write_text(
        "accelerators:\n  - name: h100-160\n    aliases: []\n"
        "    kind: gpu\n    memory_bytes: 171798691840\n    hbm_bandwidth_bytes_per_s: 3.35e12\n"
        "    bf16_flops: 989.4e12\n    fp8_flops: 1978.9e12\n    fp4_flops: null\n"
        "    int8_ops: 1978.9e12\n    nvlink_bytes_per_s: 900.0e9\n    nvlink_domain: 8\n"
        "    internode_bytes_per_s: 400.0e9\n    price_usd_per_hour: 5.0\n"
        "    price_source: test\n    source: test\n"
    )
    out_file = tmp_path / "fleet.yaml"
    args = ["--catalog", str(catalog), "--accelerator", "h100-160", "--count", "8"]
    code, out, _ = run(capsys, *args, "--model", "deepseek-v3", "--json", "--out", str(out_file))
    data = json.loads(out)
    assert code == 0 and data["fits"] is True
    assert data["cost"]["usd_per_hour"] == pytest.approx(40.0)
    assert load_config(out_file).hardware.catalog == str(catalog)
    code, again, _ = run(capsys, "-c", str(out_file), "--json")
    assert code == 0 and json.loads(again)["kv_capacity_tokens"] == data["kv_capacity_tokens"]
