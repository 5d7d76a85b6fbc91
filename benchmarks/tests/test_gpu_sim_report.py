from pathlib import Path

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
