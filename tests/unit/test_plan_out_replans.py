"""`plan --out` writes the answer it printed: whatever rung of the memory ladder was chosen,
the fleet.yaml it writes plans again as "fits", with the same command, layout and knobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servepilot.cli.main import main

# One combination per rung the first fitting step can be, each with the action it must be.
RUNGS = {
    "cut max_model_len": (
        "--model llama-3.1-70b --accelerator a100-80 --count 2 --max-model-len 32768",
        "cut max_model_len 32,768 -> 3,072 (the traffic's longest)",
    ),
    "fp8 KV cache": (
        # Between 77.0 and 77.5 GiB a device, fp8 KV is what makes the room (0.25 GiB steps).
        "--model llama-3.1-70b --accelerator h100 --count 2 --memory-gib 77.25",
        "quantize the KV cache to fp8",
    ),
    "fp8 weights, quantized as vLLM loads them": (
        "--model llama-3.1-70b --accelerator h100 --count 1 --memory-gib 84",
        "quantize the KV cache to fp8 and the weights to fp8",
    ),
    "int8, a published checkpoint": (
        "--model llama-3.1-8b --accelerator a100-40 --count 1 --memory-gib 14",
        "quantize the KV cache to fp8 and the weights to int8: serve "
        "RedHatAI/Meta-Llama-3.1-8B-Instruct-quantized.w8a8",
    ),
    "int8, a checkpoint to make": (
        "--model qwen3-32b --accelerator a100-40 --count 1 --memory-gib 42",
        "quantize the KV cache to fp8 and the weights to int8: serve "
        "<int8 checkpoint of qwen3-32b>",
    ),
    "4 bits, a published checkpoint": (
        "--model deepseek-v3 --accelerator h100 --count 8",
        "quantize the KV cache to fp8 and the weights to 4 bits: serve "
        "cognitivecomputations/DeepSeek-V3-AWQ",
    ),
    "4 bits, a checkpoint to make": (
        "--model deepseek-v3.2 --accelerator a100-80 --count 8",
        "quantize the KV cache to fp8 and the weights to 4 bits: serve "
        "<awq checkpoint of deepseek-v3.2>",
    ),
    "more accelerators of the node": (
        "--model deepseek-v4-flash --accelerator h200 --count 1",
        "or, at the original precision, with --count 2",
    ),
    "more nodes": (
        "--model deepseek-v3 --accelerator a100-80 --count 1",
        "or, at the original precision, with --count 8 --nodes 2",
    ),
    "cut max_model_len on CPU": (
        # bf16 named: `auto` on CPU depends on the machine's instruction set.
        "--memory-gib 0.1 --max-model-len 8192 --weights-dtype bf16",
        "cut max_model_len 8,192 -> 3,072 (the traffic's longest)",
    ),
}


def plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["plan", *args, "--json"])
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    return code, data


@pytest.mark.parametrize("rung", list(RUNGS))
def test_the_written_fleet_yaml_plans_again_as_fits_with_the_same_answer(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, rung: str
) -> None:
    args, action = RUNGS[rung]
    out_file = tmp_path / "fleet.yaml"
    code, first = plan(capsys, *args.split(), "--out", str(out_file))
    assert code == 1 and not first["fits"]
    suggested = first["suggested"]
    assert suggested["action"] == action

    code, again = plan(capsys, "-c", str(out_file))
    assert code == 0 and again["fits"], again["shortfall_bytes"]
    # The same answer: the command (checkpoint, precision, layout, knobs) and the rung's layout.
    assert again["vllm_command"] == suggested["vllm_command"]
    (step,) = [s for s in first["ladder"] if s["action"] == action]
    assert again["layout"]["name"] == step["layout"]
