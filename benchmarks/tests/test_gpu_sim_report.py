import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.gpu_host_fit import prompt_tokens, solve_host
from benchmarks.gpu_sim_cases import RUNS
from benchmarks.gpu_sim_report import vllm_knobs, workload

# vLLM 0.22's line when up starts a replica with KV events on (Qwen2.5-32B, the third loan).
LINE = (
    "(APIServer pid=897) INFO 12-05 18:13:39 [utils.py:278] non-default args: {'host': "
    "'127.0.0.1', 'port': 53171, 'max_model_len': 32768, 'gpu_memory_utilization': 0.95, "
    "'max_num_batched_tokens': 8192, 'max_num_seqs': 65, 'enable_chunked_prefill': True, "
    "'kv_events_config': KVEventsConfig(enable_kv_cache_events=True, publisher='zmq', "
    "endpoint='tcp://*:46535', buffer_steps=10000, topic='')}"
)


FIGURES = {"ttft_p50_ms": 100.0, "tpot_p50_ms": 10.0, "output_tok_s": 1000.0}
"""What each judged case below measured."""


def case(name: str, predicted: dict[str, float], **extra: Any) -> dict[str, Any]:
    """A validation case as the report's `judge` writes it, measured as `FIGURES`."""
    return {"case": name, "set": "validation", "measured": FIGURES, "predicted": predicted,
            **extra}  # fmt: skip


def test_knobs_are_read_past_a_config_object(tmp_path: Path) -> None:
    (tmp_path / "r0.startup.log").write_text("INFO starting\n" + LINE + "\n")
    assert vllm_knobs(tmp_path) == {
        "max_num_seqs": 65,
        "max_num_batched_tokens": 8192,
        "gpu_memory_utilization": 0.95,
    }


def test_a_case_names_its_workload() -> None:
    trace_run = next(r for r in RUNS if r.trace is not None)
    closed = next(r for r in RUNS if r.name == "closed-mid")
    assert workload(trace_run, trace_run.levels[0])["trace"] == trace_run.trace
    assert workload(trace_run, trace_run.levels[0])["rate"] == float(trace_run.levels[0])
    assert workload(closed, "64") == {
        "bench_flags": list(closed.flags),
        "concurrency": 64.0,
        "trace": None,
    }


def test_the_sweet_spot_is_where_throughput_stops_growing_within_the_slo() -> None:
    from benchmarks.gpu_sim_report import LADDER_RUNS, sweet_concurrency
    from servepilot.core.results import load_result

    folder = Path(__file__).parents[1] / "gpu_runs/2026-12-05-sim-validate-h100/qwen2.5-32b"
    runs = [
        r for name in LADDER_RUNS for r in load_result(folder / name / "rep2/results.json").runs
    ]
    assert sorted(r.load.value for r in runs) == [1, 4, 16, 64, 256, 512]
    # Interactive: 16 requests at once already wait over a second for a first token (p50
    # 1,124 ms), so of 1 and 4, 4 gives the most (101 tok/s against 40).
    assert sweet_concurrency(runs, (1000.0, 40.0)) == 4.0
    # Looser: 64 has requests refused by the gateway (16 of 64): 16 is the last within it.
    assert sweet_concurrency(runs, (3000.0, 60.0)) == 16.0


LOAN_3 = Path(__file__).parents[1] / "gpu_runs/2026-12-06-sim-validate-h100"


def test_a_measurement_served_from_the_prefix_cache_is_shown_and_not_judged() -> None:
    from benchmarks.gpu_judged_table import table
    from benchmarks.gpu_judging import cache_warm
    from benchmarks.gpu_sim_report import cache_hit_pct

    # The H100 loan of 2026-12-06: closed-short ran after a warm-up with the same seed, and
    # vLLM served 17,856 of its 18,000 prompt tokens from its cache; the long-tailed trace's
    # prompts were new (5,472 of 306,744).
    warm = cache_hit_pct(LOAN_3 / "llama-8b-fp8/closed-short/rep2")
    cold = cache_hit_pct(LOAN_3 / "llama-8b-fp8/longtail-s3/rep2")
    assert warm is not None and abs(warm - 100 * 17_856 / 18_000) < 1e-9
    assert cold is not None and abs(cold - 100 * 5_472 / 306_744) < 1e-9
    # The runs before had no scrapes: unknown, judged as before.
    assert (
        cache_hit_pct(LOAN_3.parent / "2026-12-05-sim-validate-h100/llama-8b/closed-mid/rep2")
        is None
    )
    rows = [
        case("a", FIGURES | {"ttft_p50_ms": 150.0}, cache_hit_pct=warm),
        case("b", FIGURES, cache_hit_pct=cold),
        case("c", FIGURES),
    ]
    assert [cache_warm(r) for r in rows] == [True, False, False]
    text = table(rows)
    assert "1 cases cache-warm" in text
    # Judged on b and c alone: no TTFT error at all, where a's +50% would have made it 0.0% /
    # 50.0% (median / p90 of three).
    assert "validation  ttft_p50_ms   n= 2 median |err|   0.0%  p90   0.0%" in text


def test_no_two_measurements_of_the_suite_share_prompts() -> None:
    from benchmarks.gpu_sim_validate import run_seed

    # bench gives level i of seed s the prompts of seed s + i.
    streams = [
        run_seed(run, rep, direct) + i
        for run in RUNS
        for rep in (1, 2)
        for direct in (False, True)
        for i in range(len(run.levels))
    ]
    assert len(streams) == len(set(streams))
    # The warm-up passes' seeds (10,000 and 20,000, four levels each) are none of these.
    assert not set(streams) & {10_000 * k + i for k in (1, 2) for i in range(4)}


COLD = Path(__file__).parents[1] / "gpu_runs/2026-12-06-sim-validate-h100-cold"


def test_with_a_seed_each_the_same_run_is_measured_cold() -> None:
    from benchmarks.gpu_sim_report import cache_hit_pct

    # The fifth loan, after `run_seed`: llama-8b-fp8's closed-short, the run that was 99.2%
    # warm at the fourth loan, asked 18,000 prompt tokens each time and found 288 in the
    # cache (16 for each of its 18 requests, warm-ups included); prefix3000's four shared
    # prefixes are the workload: 765,136 of 899,500.
    for rep in ("rep1", "rep2"):
        pct = cache_hit_pct(COLD / "llama-8b-fp8/closed-short" / rep)
        assert pct is not None and abs(pct - 100 * 288 / 18_000) < 1e-9
    shared = cache_hit_pct(COLD / "deepseek-v2-lite/prefix3000/rep1")
    assert shared is not None and abs(shared - 100 * 765_136 / 899_500) < 1e-9


def test_the_host_fit_recovers_a_known_overhead_and_intake() -> None:
    """A host that adds 40 ms to every request and 8 us per prompt token: 48 ms beside the
    engine's steps at 1,000 tokens, 296 ms at 32,000."""
    request_ms, intake_us = solve_host((1000, 48.0), (32000, 296.0))
    assert request_ms == pytest.approx(40.0)
    assert intake_us == pytest.approx(8.0)
    # The suite's calibration prompts the fit reads.
    assert prompt_tokens("llama-8b", "closed-short") == 1000
    assert prompt_tokens("llama-8b", "long-max") == 32000
    assert prompt_tokens("deepseek-v2-lite", "long-max") == 16184


def test_a_moe_measured_on_its_dummy_routers_is_shown_and_not_judged(tmp_path: Path) -> None:
    from benchmarks.gpu_judged_table import table
    from benchmarks.gpu_judging import ROUTING_SIMULATED, dummy_routing

    # The fourth loan's DeepSeek-V2-Lite ran with its dummy weights' own routers; Llama has
    # no experts; a start that logs vLLM's routing simulator is judged.
    assert dummy_routing(LOAN_3 / "deepseek-v2-lite")
    assert not dummy_routing(LOAN_3 / "llama-8b")
    simulated = tmp_path / "deepseek-v2-lite"
    simulated.mkdir()
    (simulated / "r0.startup.log").write_text(
        f"(EngineCore pid=1) WARNING [routing_simulator_router.py:294] {ROUTING_SIMULATED} "
        "using a uniform_random strategy.\n"
    )
    assert not dummy_routing(simulated)
    rows = [
        case("moe", FIGURES | {"tpot_p50_ms": 25.0}, dummy_routing=True),
        case("dense", FIGURES, dummy_routing=False),
    ]
    text = table(rows)
    assert "1 cases of a MoE on dummy weights' own routing" in text
    assert "validation  tpot_p50_ms   n= 1 median |err|   0.0%" in text


def test_a_workload_that_shares_prefixes_is_judged_on_its_own_hits() -> None:
    from benchmarks.gpu_judging import cache_warm

    # prefix3000: vLLM served 85% from its cache, and so did the simulator from an empty one
    # (the workload's four shared prefixes); the same 85% after an earlier run's prompts is warm.
    assert not cache_warm({"cache_hit_pct": 85.1, "sim_cache_hit_pct": 84.0})
    assert cache_warm({"cache_hit_pct": 85.1, "sim_cache_hit_pct": 1.0})
    assert cache_warm({"cache_hit_pct": 85.1})
    assert not cache_warm({"cache_hit_pct": 4.0})


def test_each_model_is_judged_on_its_own_cases_too() -> None:
    from benchmarks.gpu_judged_table import table

    # Two models: one predicted exactly, one 30% slow on its first token. Together the
    # median hides which one misses; the per-model lines say it.
    rows = [
        case("llama-8b/a@1", FIGURES),
        case("llama-8b/b@1", FIGURES),
        case("deepseek-v2-lite/a@1", FIGURES | {"ttft_p50_ms": 130.0}),
        case("deepseek-v2-lite/b@1", FIGURES | {"ttft_p50_ms": 70.0}),
    ]
    text = table(rows)
    assert "validation  ttft_p50_ms   n= 4 median |err|  15.0%" in text
    assert "validation, per model" in text
    assert "  deepseek-v2-lite   ttft_p50_ms   n= 2 median |err|  30.0%" in text
    assert "  llama-8b           ttft_p50_ms   n= 2 median |err|   0.0%" in text
    # One model alone: no per-model lines (they would repeat the set's).
    assert "per model" not in table(rows[:2])


def test_a_case_measured_on_two_loans_shows_how_far_apart_they_are() -> None:
    from benchmarks.gpu_judged_table import table

    # a@1 measured on two loans, its first token 20% later the second time; b@1 10% earlier;
    # c@1 once. Against each other: 20% and 10%, median 15%.
    later = {**FIGURES, "ttft_p50_ms": 120.0}
    earlier = {**FIGURES, "ttft_p50_ms": 90.0}
    rows = [
        case("llama-8b/a@1", FIGURES),
        case("llama-8b/b@1", FIGURES),
        case("llama-8b/c@1", FIGURES),
        {**case("llama-8b/a@1", FIGURES), "measured": later},
        {**case("llama-8b/b@1", FIGURES), "measured": earlier},
    ]
    text = table(rows)
    assert "the same case measured on two loans" in text
    assert "  ttft_p50_ms   n= 2 apart: median  15.0%  p90  20.0%" in text
    assert "  tpot_p50_ms   n= 2 apart: median   0.0%" in text
    # Each case once: no such lines.
    assert "two loans" not in table(rows[:3])


def test_eager_steps_go_to_their_own_profile_or_to_the_models_other_format(
    tmp_path: Path,
) -> None:
    from benchmarks.gpu_traced import write_traced

    for model, dtype in (("llama-3.1-8b", "bf16"), ("llama-3.1-8b", "fp8"), ("qwen", "bf16")):
        doc = {"model": model, "dtype": dtype, "meta": {"step_overhead_ms": 0.2}}
        (tmp_path / f"{model}-{dtype}.json").write_text(json.dumps(doc))

    def meta(name: str) -> dict[str, float]:
        return dict(json.loads((tmp_path / f"{name}.json").read_text())["meta"])

    bf16 = {"eager_step_ms": 26.3, "eager_mixed_step_ms": 21.5}
    write_traced(tmp_path, {("llama-3.1-8b", "bf16"): bf16})
    # FP8 was not traced: it takes bf16's; a model not traced keeps what it had.
    assert meta("llama-3.1-8b-fp8") == {"step_overhead_ms": 0.2, **bf16}
    assert meta("llama-3.1-8b-bf16") == {"step_overhead_ms": 0.2, **bf16}
    assert meta("qwen-bf16") == {"step_overhead_ms": 0.2}
    fp8 = {"eager_step_ms": 40.0}
    write_traced(tmp_path, {("llama-3.1-8b", "bf16"): bf16, ("llama-3.1-8b", "fp8"): fp8})
    assert meta("llama-3.1-8b-fp8")["eager_step_ms"] == 40.0  # its own, once traced
    assert meta("llama-3.1-8b-bf16")["eager_step_ms"] == 26.3


def _loan(root: Path, us_per_token: float | None) -> Path:
    """A loan folder with a Llama FP8 profile; with `us_per_token`, its calibration case
    closed-mid@16 measured with token arrivals: 16 requests, a step every 10 ms, a step's
    tokens `us_per_token` apart."""
    import gzip

    profiles = root / "profiles"
    profiles.mkdir(parents=True)
    doc = {"model": "llama-3.1-8b", "dtype": "fp8", "meta": {}}
    (profiles / "h100-llama-3.1-8b-fp8.json").write_text(json.dumps(doc))
    if us_per_token is not None:
        rep = root / "llama-8b-fp8" / "closed-mid" / "rep1"
        rep.mkdir(parents=True)
        (rep / "results.json").write_text("{}")
        with gzip.open(rep / "token_times.jsonl.gz", "wt") as out:
            for k in range(16):
                chunks = [step * 0.01 + k * us_per_token / 1e6 for step in range(30)]
                line = {"load_value": 16.0, "index": k, "warmup": False, "chunk_s": chunks}
                out.write(json.dumps(line) + "\n")
    return root


def test_each_loan_streams_at_its_own_hosts_speed(tmp_path: Path) -> None:
    from benchmarks.gpu_host_fit import fit_streaming

    case = next(r for r in RUNS if r.config == "llama-8b-fp8" and r.name == "closed-mid")
    assert "16" in case.calibration
    fast, slow = _loan(tmp_path / "fast", 40.0), _loan(tmp_path / "slow", 80.0)
    none = _loan(tmp_path / "none", None)
    fits = fit_streaming([fast, slow, none])

    def streaming(loan: Path) -> float:
        doc = json.loads((loan / "profiles" / "h100-llama-3.1-8b-fp8.json").read_text())
        return float(doc["meta"]["output_us_per_token"])

    assert streaming(fast) == 40.0
    assert streaming(slow) == 80.0
    # Without token arrivals: the reading of all, 30 steps at 40 us and 30 at 80.
    assert streaming(none) == 60.0
    assert set(fits) == {"fast", "slow", "none"}
    assert fit_streaming([none]) == {}


def test_a_loan_without_a_models_calibration_cases_takes_its_fit_from_another(
    tmp_path: Path,
) -> None:
    from benchmarks.gpu_sim_report import lend_fits

    fp8_alone, both = _loan(tmp_path / "fp8", None), _loan(tmp_path / "both", None)
    deepseek = {"model": "deepseek-v2-lite", "dtype": "bf16", "meta": {}}
    (fp8_alone / "profiles" / "h100-deepseek-v2-lite-bf16.json").write_text(json.dumps(deepseek))
    llama, own = {"request_overhead_ms": 8.5}, {"request_overhead_ms": 6.75}
    lend_fits({both: {"llama-3.1-8b": llama}, fp8_alone: {"deepseek-v2-lite": own}})

    def meta(loan: Path, name: str) -> dict[str, Any]:
        return dict(json.loads((loan / "profiles" / name).read_text())["meta"])

    assert meta(fp8_alone, "h100-llama-3.1-8b-fp8.json") == llama  # lent
    assert meta(fp8_alone, "h100-deepseek-v2-lite-bf16.json") == {}  # its own: left as fitted
    assert meta(both, "h100-llama-3.1-8b-fp8.json") == {}  # fitted there: not rewritten
