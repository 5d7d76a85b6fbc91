"""accept's verdicts, item by item, on measurements with known answers (seed 004's checklist)."""

import dataclasses

from servepilot.core.config import FleetConfig, parse_config
from servepilot.core.results import BenchResult, Load, LoadMode, Run, Source, Stats, SweetSpot
from servepilot.core.results import Window as SoakWindow
from servepilot.engine.startup_log import KvCapacity
from servepilot.observe.accept.items import (
    Measured,
    Smoke,
    Verdict,
    checklist,
    quantization,
    soak,
    startup_baseline,
    sweep_measured,
    sweet_spot,
    tensor_parallel,
)
from servepilot.observe.accept.run import is_moe

PASS, FAIL, NA = Verdict.PASS, Verdict.FAIL, Verdict.NOT_APPLICABLE
GPU_NODE = {"hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8}}


ENGINE = "r0 VLLM::EngineCor (pid 101)"


def run(level: float, p99_ms: float, *, failed: int = 0, windows: tuple[SoakWindow, ...] = (),
        growth: float | None = None, errors: dict[str, int] | None = None,
        by_source: dict[str, float] | None = None) -> Run:  # fmt: skip
    s = Stats(mean=p99_ms / 2, p50=p99_ms / 2, p90=p99_ms * 0.9, p99=p99_ms, count=100)
    return Run(
        load=Load(mode=LoadMode.CONCURRENCY, value=level), duration_s=10.0,
        completed=100 - failed, failed=failed, request_throughput=10.0,
        output_throughput=100.0 * level, total_token_throughput=200.0, ttft_ms=s, tpot_ms=s,
        itl_ms=s, e2e_ms=s, goodput_rps=10.0, slo_attainment=1.0, windows=windows,
        memory_growth_bytes_per_request=growth, errors=errors or {},
        memory_growth_by_source_bytes_per_request=by_source or {},
    )  # fmt: skip


def window(p99_ms: float, completed: int = 100) -> SoakWindow:
    return SoakWindow(start_s=0, end_s=10, completed=completed, failed=0, request_throughput=1.0,
                      output_throughput=10.0, ttft_p99_ms=p99_ms, e2e_p99_ms=p99_ms)  # fmt: skip


def sweep(*runs: Run, spot: float | None = 4) -> BenchResult:
    sweet = SweetSpot(load=Load(mode=LoadMode.CONCURRENCY, value=spot), reason="the knee") \
        if spot is not None else None  # fmt: skip
    return BenchResult(source=Source.MEASURED, target={}, workload={}, runs=runs, sweet_spot=sweet)


def test_tp_must_fill_the_node_on_gpus_and_does_not_apply_on_cpu() -> None:
    tp8 = parse_config({**GPU_NODE, "engine": {"tensor_parallel_size": 8}}, origin="t")
    tp4 = parse_config({**GPU_NODE, "engine": {"tensor_parallel_size": 4}}, origin="t")
    assert tensor_parallel(tp8, 1).verdict is PASS
    item = tensor_parallel(tp4, 2)
    assert item.verdict is FAIL
    assert item.evidence == "tensor_parallel_size 4 x data_parallel_size 1 on a node of 8 GPUs"
    cpu = tensor_parallel(FleetConfig(), 2)
    assert (cpu.verdict, cpu.evidence) == (NA, "CPU replicas: no tensor parallelism (2 replicas)")


def test_startup_baseline_needs_every_replicas_kv_line() -> None:
    kv = KvCapacity(93_184, 2048, 45.5)
    ok = startup_baseline({"r0": kv}, FleetConfig())
    assert ok.verdict is PASS
    assert ok.evidence == (
        "r0: 93,184 KV tokens, 45.5 requests of 2,048 tokens at once; max_num_seqs vLLM default"
    )
    assert startup_baseline({"r0": kv, "r1": None}, FleetConfig()).verdict is FAIL
    assert startup_baseline({}, FleetConfig()).verdict is NA


def test_the_sweep_needs_two_measured_levels() -> None:
    assert sweep_measured(sweep(run(1, 100), run(2, 120))).verdict is PASS
    assert sweep_measured(sweep(run(1, 100))).verdict is FAIL
    assert sweep_measured(None).verdict is FAIL


def test_the_sweet_spot_is_held_to_the_fleets_slo() -> None:
    result = sweep(run(1, 100), run(2, 150), run(4, 600))
    loose = parse_config({"slo": {"e2e_p99_ms": 1000}}, origin="t")
    tight = parse_config({"slo": {"e2e_p99_ms": 500}}, origin="t")
    assert sweet_spot(result, loose).verdict is PASS
    item = sweet_spot(result, tight)
    assert item.verdict is FAIL and item.evidence.endswith("over the SLA: e2e_p99_ms 600 > 500")
    assert sweet_spot(sweep(run(1, 100), spot=None), loose).verdict is FAIL


def test_quantization_is_needed_only_when_the_kv_cache_binds() -> None:
    assert quantization(0.0, FleetConfig()).verdict is PASS
    assert quantization(12.0, FleetConfig()).verdict is FAIL
    fp8 = parse_config({"engine": {"kv_cache_dtype": "fp8"}}, origin="t")
    assert quantization(12.0, fp8).verdict is PASS
    assert quantization(None, FleetConfig()).verdict is NA


def test_the_soak_fails_on_a_leak_an_avalanche_or_a_drifting_p99() -> None:
    config = FleetConfig()
    steady = run(4, 200, windows=(window(180), window(200)), growth=1024.0,
                 by_source={ENGINE: 2048.0})  # fmt: skip
    assert soak(steady, 120, config).verdict is PASS
    leak = soak(run(4, 200, growth=3 * 2**20), 120, config)
    assert (
        leak.verdict is FAIL
        and "memory grew 3.0 MiB per request (leak above 2 MiB)" in leak.evidence
    )
    # 2 of 100 failed: above the 1% an avalanche starts at.
    failing = soak(run(4, 200, failed=2, errors={"http_503": 2}), 120, config)
    assert (
        failing.verdict is FAIL and "2 of 100 requests failed {'http_503': 2}" in failing.evidence
    )
    drift = soak(run(4, 200, windows=(window(100), window(250))), 120, config)
    assert drift.verdict is FAIL and "E2E P99 drifted 2.5x" in drift.evidence
    # Windows of 99 requests: their P99 is one slow request, and the drift is not judged.
    short = soak(run(4, 200, windows=(window(100, 99), window(250, 99)), growth=1024.0,
                     by_source={ENGINE: 2048.0}), 5, config)  # fmt: skip
    assert short.verdict is PASS
    assert "P99 drift not judged: fewer than two windows hold the 100 requests" in short.evidence
    assert "not judged" not in soak(steady, 120, config).evidence
    assert "shorter than the 30 min acceptance soak" in soak(steady, 120, config).evidence
    assert "shorter" not in soak(steady, 1800, config).evidence
    assert soak(None, 120, config).verdict is FAIL


def test_the_soak_checks_the_replicas_memory_not_only_the_gateways() -> None:
    config = FleetConfig()
    engine_leak = run(4, 200, growth=1024.0, by_source={ENGINE: 3 * 2**20, "gpu0": 0.0})
    item = soak(engine_leak, 120, config)
    assert item.verdict is FAIL
    assert f"{ENGINE}: memory grew 3.0 MiB per request (leak above 2 MiB)" in item.evidence
    ok = soak(run(4, 200, growth=1024.0, by_source={ENGINE: 2048.0}), 120, config)
    assert ok.verdict is PASS
    assert "memory a request: the gateway 1.0 KiB, the replicas' at most 2.0 KiB" in ok.evidence


def test_a_soak_that_read_no_replica_memory_says_it_could_not_check_for_a_leak() -> None:
    # The gateway's /metrics alone is not the engine: a leak inside vLLM would pass unseen.
    for gateway_only in (run(4, 200, growth=1024.0), run(4, 200)):
        item = soak(gateway_only, 120, FleetConfig())
        assert item.verdict is FAIL
        assert "could not check the replicas for a leak" in item.evidence


def test_the_checklist_is_the_seeds_eight_items_in_order() -> None:
    measured = Measured(
        config=FleetConfig(), kv={"r0": KvCapacity(93_184, 2048, 45.5)},
        smoke=Smoke(True, "hello", 0.05), sweep=sweep(run(1, 100), run(2, 150), run(4, 200)),
        soak=run(4, 200, by_source={ENGINE: 0.0}), soak_s=60.0, preemptions=0.0,
        recorded=True, replicas=1,
    )  # fmt: skip
    items = checklist(measured)
    assert [i.number for i in items] == list(range(1, 9))
    assert [i.verdict for i in items] == [NA, PASS, PASS, PASS, PASS, PASS, PASS, PASS]
    failed_smoke = dataclasses.replace(measured, smoke=Smoke(False, "HTTP 503: no replica", 0.01))
    assert checklist(failed_smoke)[1].verdict is FAIL


def test_a_moe_model_on_a_full_node_needs_expert_parallelism() -> None:
    node = {**GPU_NODE, "model": {"source": "deepseek-v3"}}
    tp8 = parse_config({**node, "engine": {"tensor_parallel_size": 8}}, origin="t")
    ep = parse_config({**node, "engine": {"tensor_parallel_size": 8,
                                          "enable_expert_parallel": True}}, origin="t")  # fmt: skip
    assert is_moe(tp8) is True and is_moe(FleetConfig()) is False
    assert is_moe(parse_config({"model": {"source": "/no/such/model"}}, origin="t")) is None
    item = tensor_parallel(tp8, 1, moe=True)
    assert item.verdict is FAIL and item.evidence.endswith(
        "set engine.enable_expert_parallel: true"
    )
    assert tensor_parallel(ep, 1, moe=True).verdict is PASS
    unknown = tensor_parallel(tp8, 1, moe=None)
    assert unknown.verdict is PASS and "could not be read" in unknown.evidence
