"""Remedies that run as printed: the checkpoint a quantized rung serves, TP inside a node before
PP across nodes, and the Ray launch of a replica wider than a node."""

from __future__ import annotations

import json

import pytest

from servepilot.cli.main import main
from servepilot.plan.advice import Deployment
from servepilot.plan.checkpoint import checkpoint_for
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.planner import make_plan
from servepilot.plan.presets import load_preset
from tests.unit.test_plan import request


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    main(["plan", *args, "--json"])
    data: dict[str, object] = json.loads(capsys.readouterr().out)
    return data


def test_a_preset_names_its_published_awq_checkpoint() -> None:
    spec = load_preset("deepseek-v3")
    awq = checkpoint_for(spec, "deepseek-v3", WeightDtype.AWQ)
    assert awq.model == "cognitivecomputations/DeepSeek-V3-AWQ" and not awq.is_placeholder
    # The published format, and fp8 (vLLM quantizes 16-bit weights as it loads them), serve
    # the published checkpoint.
    assert checkpoint_for(spec, "deepseek-v3", WeightDtype.FP8).model == "deepseek-ai/DeepSeek-V3"
    llama = load_preset("llama-3.1-70b")
    assert checkpoint_for(llama, "llama-3.1-70b", WeightDtype.FP8) == checkpoint_for(
        llama, "llama-3.1-70b", WeightDtype.BF16
    )
    assert checkpoint_for(llama, "llama-3.1-70b", WeightDtype.AWQ).model == (
        "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4"
    )


def test_without_a_known_checkpoint_the_placeholder_says_to_fill_it_in() -> None:
    found = checkpoint_for(load_preset("deepseek-v3.2"), "deepseek-v3.2", WeightDtype.AWQ)
    assert found.model == "<awq checkpoint of deepseek-v3.2>" and found.is_placeholder
    assert found.note.startswith("fill in <awq checkpoint of deepseek-v3.2>")
    # Another release of the same shape (an alias naming its own repository) does not borrow
    # the preset's checkpoints.
    r1 = load_preset("deepseek-ai/DeepSeek-R1")
    assert checkpoint_for(r1, "deepseek-r1", WeightDtype.AWQ).is_placeholder


def test_the_awq_rung_serves_the_awq_checkpoint_not_the_fp8_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = plan_json(capsys, "--model", "deepseek-v3", "--accelerator", "h100", "--count", "8")
    suggested = data["suggested"]
    assert isinstance(suggested, dict)
    assert suggested["action"] == (
        "quantize the KV cache to fp8 and the weights to 4 bits: serve "
        "cognitivecomputations/DeepSeek-V3-AWQ"
    )
    command = suggested["vllm_command"]
    assert command.startswith("vllm serve cognitivecomputations/DeepSeek-V3-AWQ ")
    assert "deepseek-ai/DeepSeek-V3 " not in command
    # One node runs it, and the advice printed beside it says so.
    assert suggested["advice"]["deployment"] == "single-node"


def test_a_replica_over_two_nodes_prints_the_ray_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = plan_json(
        capsys, "--model", "deepseek-v3", "--accelerator", "h100", "--count", "8", "--nodes", "2"
    )
    assert data["fits"] is True
    command = data["vllm_command"]
    assert isinstance(command, str)
    assert "--pipeline-parallel-size 2" in command
    assert command.endswith("--distributed-executor-backend ray")
    launch = [line for line in data["launch"] if not line.startswith("#")]  # type: ignore[union-attr]
    assert launch == [
        "ray start --head --port=6379",
        "ray start --address=<head node IP>:6379",
        command,
    ]


def test_the_original_precision_on_two_nodes_is_offered_with_its_launch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = plan_json(capsys, "--model", "deepseek-v3", "--accelerator", "h100", "--count", "8")
    alternative = data["alternative"]
    assert isinstance(alternative, dict)
    assert alternative["action"] == "or, at the original precision, with --nodes 2"
    assert alternative["vllm_command"].startswith("vllm serve deepseek-ai/DeepSeek-V3 ")
    assert "ray start --head --port=6379" in alternative["launch"]


def test_one_h200_too_small_for_llama_70b_gets_tp2_in_the_node_not_two_nodes() -> None:
    plan = make_plan(request("llama-3.1-70b", "h200", count=1))
    assert not plan.fits
    actions = [step.action for step in plan.ladder]
    assert "quantize the KV cache to fp8 and the weights to fp8" in actions
    wider = [step for step in plan.ladder if step.widens]
    assert len(wider) == 1
    assert wider[0].changes == {"count": 2} and wider[0].layout == "TP2" and wider[0].fits
    assert wider[0].action == "or, at the original precision, with --count 2"
    assert plan.advice.deployment is Deployment.SINGLE_NODE
    assert not any("nodes" in reason for reason in plan.advice.reasons)


def test_a_full_node_too_small_widens_to_nodes_of_the_full_count() -> None:
    # DeepSeek-V3 on 4 H100: 8 of the node do not fit either, so two whole nodes of 8.
    plan = make_plan(request("deepseek-v3", "h100", count=4))
    wider = [step for step in plan.ladder if step.widens]
    assert wider[0].changes == {"nodes": 2, "count": 8}
    assert wider[0].layout == "TP8+PP2+EP8"
    assert plan.advice.deployment is Deployment.DISTRIBUTED
    assert plan.advice.reasons == ("the model needs 2 nodes for one replica",)


def test_the_terminal_shows_the_suggested_rungs_advice_and_both_launches(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["plan", "--model", "deepseek-v3", "--accelerator", "h100", "--count", "8"])
    out = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    assert code == 1
    rung = (
        "quantize the KV cache to fp8 and the weights to 4 bits: serve "
        "cognitivecomputations/DeepSeek-V3-AWQ"
    )
    assert f'after "{rung}": advice: single-node' in out
    assert f'command after "{rung}": # cognitivecomputations/DeepSeek-V3-AWQ is a published' in out
    assert "vllm serve cognitivecomputations/DeepSeek-V3-AWQ " in out
    assert "the model needs 2 nodes" not in out
    two_nodes = out[out.index("or, at the original precision, with --nodes 2:") :]
    assert "ray start --head --port=6379" in two_nodes
    assert two_nodes.rstrip().endswith("--distributed-executor-backend ray")


def test_a_pinned_count_is_not_offered_to_change_while_another_rung_fits(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Llama-3.1-70B on one H100: fp8 weights fit, so --count 1 stays the plan's; unpinned, the
    # original precision on 2 of the node is offered beside it, as the flag to change.
    pinned = plan_json(capsys, "--model", "llama-3.1-70b", "--accelerator", "h100", "--count", "1")
    actions = [step["action"] for step in pinned["ladder"]]  # type: ignore[union-attr]
    assert "quantize the KV cache to fp8 and the weights to fp8" in actions
    assert not [action for action in actions if "original precision" in action]
    assert "alternative" not in pinned
    free = make_plan(request("llama-3.1-70b", "h100"))
    assert free.ladder[-1].action == "or, at the original precision, with --count 2"
    # Pinned, with nothing else fitting: the change of the pin, named as such.
    only = plan_json(capsys, "--model", "deepseek-v4-flash", "--accelerator", "h200",
                     "--count", "1")  # fmt: skip
    suggested = only["suggested"]
    assert isinstance(suggested, dict)
    assert suggested["action"] == "or, at the original precision, with --count 2"
