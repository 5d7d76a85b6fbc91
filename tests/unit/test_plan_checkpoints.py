"""Every printed `vllm serve` runs as printed: a --quantization value vLLM 0.32 accepts, and a
quantized rung serves its checkpoint (which carries its method, so no flag)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from servepilot.cli.main import main
from servepilot.core.config import FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.engine.planned import launch_of
from servepilot.plan.checkpoint import checkpoint_for, needs_quantized_checkpoint
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.ladder import LadderStep
from servepilot.plan.planner import Plan, make_plan
from servepilot.plan.presets import load_preset, preset_names
from servepilot.plan.request import PlanRequest
from servepilot.tune.planspace import build_space
from servepilot.tune.space import Knob
from tests.unit.test_plan import request

METHODS_FILE = Path(__file__).parents[1] / "data" / "vllm_quantization_methods.txt"
VLLM_METHODS = frozenset(
    line for line in METHODS_FILE.read_text().splitlines() if line and not line.startswith("#")
)
# (accelerator, counts): one of each kind of weight support (none, fp8, fp8 + fp4) and the CPU.
ACCELERATORS = (
    ("a100-80", (1, 8)), ("h100-80", (1, 8)), ("b200", (1, 8)), ("l40s", (1, 8)), ("cpu", (1,)),
)  # fmt: skip
FORMATS = (None, *WeightDtype)  # the checkpoint's own format, then every one


def quantization_flag(command: str) -> str | None:
    words = shlex.split(command)
    return words[words.index("--quantization") + 1] if "--quantization" in words else None


def served_model(command: str) -> str:
    """`vllm serve MODEL` on GPUs; vLLM-CPU's module form takes `--model MODEL`."""
    words = shlex.split(command)
    return words[words.index("serve" if "serve" in words else "--model") + 1]


def rendered(plan: Plan) -> list[tuple[LadderStep | None, Plan]]:
    """(rung, plan) for the plan (rung None) and every rung of its ladder, as printed."""
    return [(None, plan)] + [(step, make_plan(step.request)) for step in plan.ladder]


@pytest.mark.parametrize("model", preset_names())
def test_every_rung_of_every_preset_prints_a_command_vllm_accepts(model: str) -> None:
    seen: set[WeightDtype] = set()
    for accelerator, counts in ACCELERATORS:
        for count in counts:
            for weights in FORMATS:
                top = make_plan(request(model, accelerator, count=count, weights=weights))
                for step, plan in rendered(top):
                    req = plan.request
                    launch = launch_of(plan)
                    flag = quantization_flag(launch.command)
                    what = "the plan" if step is None else step.action
                    where = f"{model} on {count} {accelerator} ({weights}), {what}"
                    assert flag is None or flag in VLLM_METHODS, where
                    checkpoint = checkpoint_for(req.model, req.model_ref, req.weights_dtype)
                    if needs_quantized_checkpoint(req.model, req.weights_dtype):
                        assert served_model(launch.command) == checkpoint.model, where
                        seen.add(req.weights_dtype)
                        # The checkpoint carries its method; a flag naming another is refused.
                        assert flag is None, where
                        assert req.weights_dtype.vllm_checkpoint_method in VLLM_METHODS
                        if step is not None and "weights_dtype" in step.changes:
                            assert what.endswith(f": serve {checkpoint.model}"), where
    assert seen  # each preset is planned in at least one format it needs a checkpoint for


def test_the_int8_rung_serves_the_w8a8_checkpoint_without_a_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Llama-3.1-70B on one A100 (no fp8 tensor cores): int8 is the 8-bit rung.
    plan = make_plan(request("llama-3.1-70b", "a100-80"))
    w8a8 = "RedHatAI/Meta-Llama-3.1-70B-Instruct-quantized.w8a8"
    int8 = next(s for s in plan.ladder if s.changes.get("weights_dtype") is WeightDtype.INT8)
    assert int8.action == f"quantize the KV cache to fp8 and the weights to int8: serve {w8a8}"
    command = launch_of(make_plan(int8.request)).command
    assert command.startswith(f"vllm serve {w8a8} ")
    assert quantization_flag(command) is None
    assert WeightDtype.INT8.vllm_checkpoint_method == "compressed-tensors"


def test_fp4_serves_nvidias_nvfp4_checkpoint_without_a_flag(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["plan", "--model", "llama-3.1-8b", "--accelerator", "b200", "--weights-dtype", "fp4",
          "--json"])  # fmt: skip
    data: dict[str, Any] = json.loads(capsys.readouterr().out)
    command = data["vllm_command"]
    assert command.startswith("vllm serve nvidia/Llama-3.1-8B-Instruct-FP4 ")
    assert quantization_flag(command) is None
    assert data["launch"][0] == (
        "# nvidia/Llama-3.1-8B-Instruct-FP4 is a published fp4 checkpoint of llama-3.1-8b"
    )


def test_online_fp8_keeps_the_published_checkpoint_and_the_flag() -> None:
    plan = make_plan(request("qwen3-32b", "l40s"))
    fp8 = next(s for s in plan.ladder if s.changes.get("weights_dtype") is WeightDtype.FP8)
    assert fp8.action == "quantize the KV cache to fp8 and the weights to fp8"
    command = launch_of(make_plan(fp8.request)).command
    assert served_model(command) == "Qwen/Qwen3-32B" and quantization_flag(command) == "fp8"


def test_a_placeholder_checkpoint_has_no_flag_and_says_how_to_make_one() -> None:
    plan = make_plan(request("deepseek-v3.2", "b200", count=8, weights=WeightDtype.FP4))
    launch = launch_of(plan)
    assert served_model(launch.command) == "<fp4 checkpoint of deepseek-v3.2>"
    assert quantization_flag(launch.command) is None
    assert launch.steps[0].endswith("or make it (NVIDIA ModelOpt or llm-compressor, NVFP4)")


@pytest.mark.parametrize(
    ("name", "fp4"),
    [
        ("deepseek-v3", None),  # nvidia's FP4 checkpoints are of later releases
        ("deepseek-ai/DeepSeek-V3-0324", "nvidia/DeepSeek-V3-0324-FP4"),
        ("deepseek-ai/DeepSeek-R1", "nvidia/DeepSeek-R1-FP4"),
        ("qwen3-32b", "nvidia/Qwen3-32B-FP4"),
        ("llama-3.1-70b", None),  # nvidia publishes Llama-3.3-70B's, another model
    ],
)
def test_a_release_gets_the_checkpoints_made_from_it(name: str, fp4: str | None) -> None:
    found = dict(load_preset(name).quantized_checkpoints).get(WeightDtype.FP4)
    assert found == fp4
    awq = dict(load_preset(name).quantized_checkpoints).get(WeightDtype.AWQ)
    assert (awq == "cognitivecomputations/DeepSeek-V3-AWQ") is (name == "deepseek-v3")


def _gpu_space(model: str, accelerator: str) -> tuple[FleetConfig, PlanRequest]:
    config = FleetConfig.model_validate(
        {"model": {"source": model},
         "hardware": {"device": "gpu", "accelerator": accelerator, "count": 1}}
    )  # fmt: skip
    return config, PlanRequest.from_fleet(config, None)


def test_tune_runs_the_fp8_rung_with_the_flag() -> None:
    # Qwen3-32B in bf16 does not fit one L40S; the planner's start is the online-fp8 rung,
    # which the configured (bf16) fleet runs only with --quantization fp8.
    config, req = _gpu_space("qwen3-32b", "l40s")
    space = build_space(config, req, longest_request_tokens=3000)
    assert space.space.default.get(Knob.WEIGHTS_DTYPE) == "fp8"
    assert space.fleet(space.space.default).engine.quantization == "fp8"


def test_every_weight_format_tune_tries_is_a_flag_vllm_accepts() -> None:
    config, req = _gpu_space("llama-3.1-8b", "h100-80")
    space = build_space(config, req, longest_request_tokens=3000)
    axis = space.space.axis(Knob.WEIGHTS_DTYPE)
    assert axis is not None and set(axis.values) == {"bf16", "fp8"}
    flags = {
        space.fleet(space.space.default.with_value(Knob.WEIGHTS_DTYPE, value)).engine.quantization
        for value in axis.values
    }
    assert flags == {None, "fp8"} and "fp8" in VLLM_METHODS


def test_tune_refuses_a_start_that_needs_another_checkpoint() -> None:
    # Llama-3.1-70B fits one A100 only in 4 bits: tune cannot make that checkpoint.
    config, req = _gpu_space("llama-3.1-70b", "a100-80")
    with pytest.raises(ConfigError) as caught:
        build_space(config, req, longest_request_tokens=3000)
    assert "only with awq weights" in str(caught.value)
    assert "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4" in (caught.value.hint or "")


def _w8a8_folder(tmp_path: Path) -> Path:
    """A RedHatAI-style W8A8 checkpoint folder: Llama-3.1-8B's config.json with llm-compressor's
    compressed-tensors quantization_config (int8 weights and activations)."""
    preset = json.loads(
        (Path(__file__).parents[2] / "servepilot/plan/presets/llama-3.1-8b.json").read_text()
    )
    weights = {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": weights}
    preset["config"]["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "config_groups": {"group_0": group},
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(preset["config"]))
    return tmp_path


@pytest.mark.parametrize("quantization", [None, "compressed-tensors"])
def test_a_w8a8_checkpoint_is_planned_in_int8_with_or_without_the_flag(
    tmp_path: Path, quantization: str | None
) -> None:
    config = FleetConfig.model_validate(
        {"model": {"source": str(_w8a8_folder(tmp_path))},
         "hardware": {"device": "gpu", "accelerator": "a100-80", "count": 1},
         "engine": {"quantization": quantization}}
    )  # fmt: skip
    assert PlanRequest.from_fleet(config, frozenset()).weights_dtype is WeightDtype.INT8


def test_vllm_method_names_mean_their_format_or_the_checkpoints() -> None:
    def weights(model: str, quantization: str) -> WeightDtype:
        config = FleetConfig.model_validate(
            {"model": {"source": model}, "engine": {"quantization": quantization},
             "hardware": {"device": "gpu", "accelerator": "b200", "count": 1}}
        )  # fmt: skip
        return PlanRequest.from_fleet(config, frozenset()).weights_dtype

    assert weights("llama-3.1-8b", "modelopt_fp4") is WeightDtype.FP4
    assert weights("llama-3.1-8b", "awq_marlin") is WeightDtype.AWQ
    with pytest.raises(ConfigError, match="checkpoint is bf16"):
        weights("llama-3.1-8b", "compressed-tensors")
