"""A GPU profile's step times in the simulated replica: each step the model's own, to the last
bit, with its token table, its eager floors and the host's time between eager launches."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import CostModel, StepShape, prefill_pairs
from servepilot.plan.gpu_profile.compose import Operating, StepComposer, linearize
from servepilot.plan.gpu_profile.table import gpu_profile_from
from servepilot.sim import ReplicaModel, SchedulerConfig, SimRequest
from tests.unit.test_gpu_profile import H100, _h100


def test_the_simulator_steps_the_same_time_as_the_model_with_a_table() -> None:
    step = _h100("llama-3.1-8b", "bf16")
    model = linearize(step, Operating(1000, 50, 16, 2048, 4096)).model
    assert len(_simulated_steps(model)) > 20


def _simulated_steps(model: CostModel) -> list[float]:
    """Six prompts of 1,000-2,500 tokens through a simulated replica (16 sequences, 2,048
    tokens a step) on `model`: each step's duration, checked to be the model's to the bit."""
    replica = ReplicaModel(
        SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=4096,
                        block_size=16, num_blocks=2000),
        model,
    )  # fmt: skip
    for i in range(6):
        replica.add(SimRequest(i, 1000 + 300 * i, 20, 0.0))
    now, durations = 0.0, []
    while (result := replica.step(now)) is not None:
        assert result.duration_s == model.step_time_s(result.shape)  # to the last bit
        now = result.end_s
        durations.append(result.duration_s)
    return durations


def test_an_eager_steps_floor_reaches_the_simulator_to_the_last_bit() -> None:
    """`meta.eager_step_ms` (a step trace's host time for a step run without a CUDA graph)
    floors every step above the largest graph, in the model and in the simulated replica."""
    document = json.loads((H100 / "h100-llama-3.1-8b-bf16.json").read_text())
    profile = gpu_profile_from({**document, "meta": {"eager_step_ms": 60.0}}, "t")
    assert profile.eager_step_s == 0.06
    assert gpu_profile_from({**document, "meta": {}}, "t").eager_step_s == 0.0
    with pytest.raises(ConfigError, match="eager_step_ms"):
        gpu_profile_from({**document, "meta": {"eager_step_ms": -1}}, "t")
    # With decoders beside the prefill: its own figure where measured, else the same.
    meta = {"eager_step_ms": 60.0, "eager_mixed_step_ms": 70.0}
    mixed = gpu_profile_from({**document, "meta": meta}, "t")
    assert (profile.eager_mixed_step_s, mixed.eager_mixed_step_s) == (0.06, 0.07)
    with pytest.raises(ConfigError, match="eager_mixed_step_ms"):
        gpu_profile_from({**document, "meta": {"eager_mixed_step_ms": -1}}, "t")
    mixed_model = linearize(StepComposer(mixed, comm_token_s=0.0, comm_step_s=0.0),
                            Operating(1000, 50, 16, 2048, 4096)).model  # fmt: skip
    assert mixed_model.step_time_s(StepShape(1000, 1, 8, 8_000, prefill_pairs(1000, 0))) == 0.07
    step = StepComposer(profile, comm_token_s=0.0, comm_step_s=0.0)
    at = Operating(1000, 50, 16, 2048, 4096)
    assert at.graph_max_tokens == 32  # vLLM captures up to 2 x max_num_seqs
    model = linearize(step, at).model
    assert (model.eager_floor_s, model.graph_max_tokens) == (0.06, 32)
    assert model.step_time_s(StepShape(0, 0, 16, 16_000, 0)) < 0.06  # a graph's decode
    assert model.step_time_s(StepShape(1000, 1, 0, 0, prefill_pairs(1000, 0))) == 0.06
    durations = _simulated_steps(model)
    assert sum(d == 0.06 for d in durations) >= 3  # the 1,000-token prefills of the first steps
    # With enforce_eager vLLM captures no graph: a decode step is launched kernel by kernel.
    eager = replace(at, cuda_graphs=False)
    assert eager.graph_max_tokens == 0
    eager_model = linearize(step, eager).model
    assert eager_model.step_time_s(StepShape(0, 0, 16, 16_000, 0)) == 0.06


def test_the_hosts_time_between_eager_launches_reaches_the_simulator_to_the_last_bit() -> None:
    """`meta.eager_host_ms` and `meta.eager_host_us_per_seq` (the host taking outputs in and
    scheduling between two launches) lengthen every eager step by a fixed part and a part a
    sequence it carries, in the model and in the simulated replica; a graph's step not."""
    document = json.loads((H100 / "h100-llama-3.1-8b-bf16.json").read_text())
    meta = {"eager_step_ms": 60.0, "eager_host_ms": 4.0, "eager_host_us_per_seq": 25.0}
    profile = gpu_profile_from({**document, "meta": meta}, "t")
    assert (profile.eager_host_s, profile.eager_host_per_seq_s) == (0.004, 25e-6)
    for key in ("eager_host_ms", "eager_host_us_per_seq"):
        with pytest.raises(ConfigError, match=key):
            gpu_profile_from({**document, "meta": {**meta, key: -1}}, "t")
    at = Operating(1000, 50, 16, 2048, 4096)
    model = linearize(StepComposer(profile, comm_token_s=0.0, comm_step_s=0.0), at).model
    # One prompt beside 8 decoders: 9 sequences, 60 + 4 + 9 x 0.025 ms.
    mixed = StepShape(1000, 1, 8, 8_000, prefill_pairs(1000, 0))
    assert model.step_time_s(mixed) == pytest.approx(0.064225, abs=1e-12)
    decode = StepShape(0, 0, 16, 16_000, 0)  # a graph's: the host's work hides behind it
    plain = replace(model, eager_host_s=0.0, eager_host_per_seq_s=0.0)
    assert model.step_time_s(decode) == plain.step_time_s(decode) < 0.06
    durations = _simulated_steps(model)  # each the model's own, to the last bit
    assert sum(d >= 0.06 + 0.004 + 25e-6 for d in durations) >= 3  # the prefills' steps
