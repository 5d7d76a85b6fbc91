"""The simulated engine's API at its edges: aborts, and what `add`, `step` and the scheduler
config refuse, as vLLM does.
"""

from __future__ import annotations

from typing import Any

import pytest

from servepilot.core.errors import ConfigError
from servepilot.sim import ReplicaModel, SimRequest
from tests.unit.sim_replica_support import COST, scheduler_config


def test_abort_frees_a_waiting_or_running_request() -> None:
    model = ReplicaModel(scheduler_config(max_num_seqs=1), COST)
    model.add(SimRequest(0, 100, 50, 0.0))
    model.add(SimRequest(1, 10, 5, 0.0))
    model.step(0.0)
    model.abort(1)
    assert model.num_waiting == 0
    model.abort(0)
    model.check()
    assert model.idle and model.kv_usage == 0.0
    model.abort(0)  # unknown now: ignored
    assert model.step(1.0) is None


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (SimRequest(1, 0, 5, 0.0), "at least one token"),
        (SimRequest(1, 5, 0, 0.0), "at least one token"),
        (SimRequest(1, 500, 13, 0.0), "513 tokens .* exceed max_model_len 512"),
        (SimRequest(1, 50, 5, 0.0, prefix_group=1, prefix_tokens=51), "within the prompt"),
    ],
)
def test_add_refuses_what_vllm_refuses(bad: SimRequest, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplicaModel(scheduler_config(), COST).add(bad)


def test_a_step_cannot_start_before_the_last_one_ended() -> None:
    model = ReplicaModel(scheduler_config(), COST)
    model.add(SimRequest(1, 5, 5, 0.0))
    result = model.step(1.0)
    assert result is not None
    with pytest.raises(ValueError, match="before the last one ended"):
        model.step(result.end_s - 1e-3)


def test_add_refuses_a_request_twice() -> None:
    model = ReplicaModel(scheduler_config(), COST)
    request = SimRequest(1, 5, 5, 0.0)
    model.add(request)
    with pytest.raises(ValueError, match="already added"):
        model.add(request)
    with pytest.raises(ValueError, match="already added"):
        model.add(SimRequest(1, 5, 5, 0.0))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"max_num_seqs": 0}, "max_num_seqs must be >= 1"),
        ({"max_num_seqs": 100, "max_num_batched_tokens": 64}, "must be >= max_num_seqs"),
        ({"enable_chunked_prefill": False}, "without chunked prefill"),
        ({"num_blocks": 32}, "cannot hold one request of max_model_len"),
    ],
)
def test_config_refuses_what_vllm_refuses(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        scheduler_config(**changes)
