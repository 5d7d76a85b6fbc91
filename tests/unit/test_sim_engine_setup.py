"""`servepilot sim` (from fleet.yaml) and a simulated replica (from the flags `up` passes it)
derive the same scheduler and KV cache: both go through sim/engine_setup.py, and this pins
that what each feeds it agrees."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servepilot.core.config import FleetConfig, parse_config
from servepilot.core.errors import ConfigError
from servepilot.engine.cpu import cpu_flags
from servepilot.engine.simserver.args import SimModel, sim_launch_command
from servepilot.engine.simserver.config import SimSetup, build_setup, parse_args
from servepilot.sim.fleet.setup import replica_setup

CPU = {"device": "cpu", "accelerator": "cpu"}
H100 = {"device": "gpu", "accelerator": "h100", "count": 8}
PROFILES = Path(__file__).parents[2] / "benchmarks/gpu_runs/2026-12-05-sim-validate-h100/profiles"

CONFIGS: dict[str, dict[str, Any]] = {
    "cpu-defaults": {},
    "cpu-no-chunked-prefill": {
        "hardware": CPU,
        "engine": {"enable_chunked_prefill": False, "max_model_len": 4096},
    },
    "cpu-no-chunked-explicit-budget": {
        "engine": {
            "enable_chunked_prefill": False,
            "max_model_len": 3000,
            "max_num_batched_tokens": 6000,
            "block_size": 16,
        },
    },
    "cpu-small-memory-no-prefix-caching": {
        "engine": {
            "cpu_kv_cache_space_gib": 0.5,
            "max_model_len": 8192,
            "max_num_seqs": 32,
            "enable_prefix_caching": False,
        },
    },
    "gpu-tp2-long-context": {
        "model": {"source": "llama-3.1-8b"},
        "hardware": H100,
        "engine": {"tensor_parallel_size": 2, "max_model_len": 32768},
    },
    "gpu-no-chunked-less-memory": {
        "model": {"source": "llama-3.1-8b"},
        "hardware": H100,
        "engine": {
            "enable_chunked_prefill": False,
            "max_model_len": 16384,
            "gpu_memory_utilization": 0.6,
            "enforce_eager": False,
        },
    },
    "gpu-pp2": {
        "model": {"source": "llama-3.1-70b"},
        "hardware": H100,
        "engine": {"tensor_parallel_size": 4, "pipeline_parallel_size": 2},
    },
    "gpu-mla-expert-parallel": {
        "model": {"source": "deepseek-v3"},
        "hardware": {"device": "gpu", "accelerator": "h200", "count": 8},
        "engine": {
            "tensor_parallel_size": 8,
            "enable_expert_parallel": True,
            "max_model_len": 65536,
        },
    },
}


def _config(raw: dict[str, Any]) -> FleetConfig:
    return parse_config(raw, origin="test") if raw else FleetConfig()


def _replica_from_flags(config: FleetConfig) -> tuple[SimSetup, list[str]]:
    """What a simulated replica `up --engine sim` launches derives from its command line."""
    model = SimModel(model_arg=config.model.source, served_name="m", tokenizer=None)
    argv = sim_launch_command(config, model, "127.0.0.1", 8000).argv
    assert argv[1:3] == ("-m", "servepilot.engine.simserver.server")
    args, ignored = parse_args(list(argv[3:]))
    return build_setup(args), ignored


@pytest.mark.parametrize("raw", CONFIGS.values(), ids=CONFIGS.keys())
def test_sim_and_a_simulated_replica_derive_the_same_engine(raw: dict[str, Any]) -> None:
    config = _config(raw)
    fleet = replica_setup(config, None, cpu_flags())
    replica, ignored = _replica_from_flags(config)
    assert ignored == []  # every flag `up` passes is one the replica reads
    assert replica.scheduler == fleet.scheduler
    assert replica.kv_capacity_tokens == fleet.kv_capacity_tokens
    assert replica.cost.coefficients == fleet.cost.coefficients


def test_without_chunked_prefill_a_prompt_of_max_model_len_fits_one_step() -> None:
    # vLLM raises max_num_batched_tokens to max_model_len when chunked prefill is off.
    s = replica_setup(_config(CONFIGS["cpu-no-chunked-prefill"]), None, cpu_flags()).scheduler
    assert not s.enable_chunked_prefill
    assert s.max_num_batched_tokens == s.max_model_len == 4096
    # ... unless it is given: then it must be large enough itself.
    s = replica_setup(
        _config(CONFIGS["cpu-no-chunked-explicit-budget"]), None, cpu_flags()
    ).scheduler
    assert (s.max_num_batched_tokens, s.max_model_len, s.block_size) == (6000, 3000, 16)


def test_both_refuse_what_vllm_refuses() -> None:
    too_long = _config({"engine": {"max_model_len": 10**6}})
    with pytest.raises(ConfigError, match="positions; vLLM refuses it"):
        replica_setup(too_long, None, cpu_flags())
    with pytest.raises(ConfigError, match="positions; vLLM refuses it"):
        _replica_from_flags(too_long)
    too_small = _config({"engine": {"cpu_kv_cache_space_gib": 0.001, "max_model_len": 8192}})
    with pytest.raises(ConfigError, match="KV cache is needed, which is larger"):
        replica_setup(too_small, None, cpu_flags())
    with pytest.raises(ConfigError, match="KV cache is needed, which is larger"):
        _replica_from_flags(too_small)


@pytest.mark.parametrize(("enforce_eager", "graph_max_tokens"), [(False, 512), (True, 0)])
def test_enforce_eager_leaves_every_gpu_step_to_the_eager_floor(
    enforce_eager: bool, graph_max_tokens: int, tmp_path: Path
) -> None:
    """A GPU profile's eager floor applies above vLLM's largest CUDA graph; with enforce_eager
    vLLM captures none, so it applies to every step."""
    document = json.loads((PROFILES / "h100-llama-3.1-8b-bf16.json").read_text())
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({**document, "meta": {"eager_step_ms": 30.0}}))
    engine = {"enforce_eager": enforce_eager, "max_model_len": 8192}
    gpu = {"device": "gpu", "accelerator": "h100", "count": 1}
    config = _config({"model": {"source": "llama-3.1-8b"}, "hardware": gpu, "engine": engine})
    cost = replica_setup(config, profile, cpu_flags()).cost
    assert (cost.eager_floor_s, cost.graph_max_tokens) == (0.03, graph_max_tokens)
