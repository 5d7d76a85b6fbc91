"""What vLLM 0.22 keeps out of the KV cache besides the weights, as plan models it: the CUDA
graphs it captures (their count follows max_num_seqs), the sampler's buffers, and the
max_num_seqs plan hands vLLM settling the memory it is planned at. Known answers from vLLM's
capture rules and from the H200 runs in benchmarks/gpu_runs/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servepilot.core.config import parse_config
from servepilot.engine.dummy_model import dummy_dir
from servepilot.engine.planned import launch_of
from servepilot.plan.memory import capture_sizes, cuda_graph_bytes
from servepilot.plan.parallel import Parallelism
from servepilot.plan.planner import Plan, make_plan
from servepilot.plan.presets import load_preset
from servepilot.plan.request import PlanRequest


def test_capture_sizes_follow_vllm_rules_as_its_startup_log_counts_them() -> None:
    # vLLM logged "PIECEWISE=11 (largest=64), FULL=7 (largest=32)" at max_num_seqs 34,
    # "PIECEWISE=13 (largest=80), FULL=8 (largest=40)" at 43, "PIECEWISE=51 (largest=512)" at 1024.
    for seqs, piecewise, full, largest in ((34, 11, 7, 64), (43, 13, 8, 80), (1024, 51, 51, 512)):
        sizes = capture_sizes(seqs, 8192)
        assert (len(sizes), sum(1 for s in sizes if s <= seqs), sizes[-1]) == (
            piecewise,
            full,
            largest,
        )
    # max_num_batched_tokens caps the largest and is captured itself.
    assert capture_sizes(1024, 100)[-3:] == (88, 96, 100)


def test_graph_memory_matches_vllms_estimates_on_the_h200() -> None:
    llama = load_preset("llama-3.1-8b")
    one = Parallelism()
    # vLLM's "Estimated CUDA graph memory": 0.50 GiB at 1,024 sequences, 0.10 GiB at 34.
    assert (
        abs(cuda_graph_bytes(llama, one, max_num_seqs=1024, batched_tokens=8192) / 2**30 - 0.50)
        < 0.03
    )
    assert (
        abs(cuda_graph_bytes(llama, one, max_num_seqs=34, batched_tokens=8192) / 2**30 - 0.10)
        < 0.01
    )


def plan_of(engine: dict[str, Any], weights: str = "real") -> Plan:
    config = parse_config(
        {
            "model": {"source": "llama-3.1-8b", "weights": weights},
            "hardware": {"device": "gpu", "accelerator": "h200-141"},
            "engine": {"max_model_len": 8192, **engine},
        },
        origin="t",
    )
    return make_plan(PlanRequest.from_fleet(config, frozenset()))


def test_a_small_kv_cache_is_planned_at_the_max_num_seqs_vllm_will_run() -> None:
    found = plan_of({"gpu_memory_utilization": 0.15})
    seqs = found.knobs.max_num_seqs.value
    # Not the starting point's 256: what the KV cache holds, and the memory is planned there.
    assert seqs == 48 and found.assessment.setting.max_num_seqs == 48
    # vLLM made 36,976 tokens at 43 sequences (2026-12-04-llama-8b-offload): within 1%.
    assert abs(found.option.kv_capacity_tokens / 36_976 - 1) < 0.01
    # A max_num_seqs the user sets is planned as set.
    given = plan_of({"gpu_memory_utilization": 0.15, "max_num_seqs": 256})
    assert given.assessment.setting.max_num_seqs == 256
    assert given.option.kv_capacity_tokens < found.option.kv_capacity_tokens


def test_the_printed_command_of_dummy_weights_serves_the_folder_up_writes() -> None:
    found = plan_of({}, weights="dummy")
    command = launch_of(found).command
    folder = str(dummy_dir("llama-3.1-8b"))
    assert f"vllm serve {folder} " in command and "--load-format dummy" in command
    assert "meta-llama" not in command
    assert Path(folder).name == "llama-3.1-8b"
