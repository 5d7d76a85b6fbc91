"""The startup-log parser on real vLLM GPU logs (tests/data/vllm_logs, sources in its
README): weight memory, CUDA graph capture, TP/EP layout, KV per GPU."""

from __future__ import annotations

from pathlib import Path

from servepilot.engine.process import ReplicaInfo
from servepilot.engine.startup_log import (
    GpuStartup,
    KvCapacity,
    parse_gpu_startup,
    parse_kv_capacity,
)
from servepilot.fleet import up

LOGS = Path(__file__).parent.parent / "data" / "vllm_logs"


def parsed(name: str) -> GpuStartup:
    return parse_gpu_startup((LOGS / name).read_text(encoding="utf-8"))


def test_weight_memory_and_load_time() -> None:
    found = parsed("tp1_model_loading.log")
    assert (found.weights_gib, found.weights_load_s) == (12.66, 31.657031)
    assert found.summary() == "weights 12.66 GiB"


def test_the_earlier_v1_weight_line_and_gpu_blocks() -> None:
    found = parsed("v1_gpu_blocks.log")
    assert found.weights_gib == 67.7229 and found.weights_load_s is None
    assert found.gpu_blocks == 1381


def test_cuda_graph_capture_time_and_memory() -> None:
    found = parsed("tp1_graph_capture.log")
    assert (found.cuda_graph_capture_s, found.cuda_graph_gib) == (5.0, 0.11)
    assert found.kv_cache_gib_per_gpu == 6.13
    assert found.summary() == "CUDA graphs 0.11 GiB in 5 s, KV 6.13 GiB per GPU"


def test_tp_and_ep_layout_from_the_rank_lines() -> None:
    text = (LOGS / "tp2_kimi_linear.log").read_text(encoding="utf-8")
    found = parse_gpu_startup(text)
    assert found.layout == {"EP": 2, "TP": 2}
    assert found.kv_cache_gib_per_gpu == 2.30
    kv = parse_kv_capacity(text)
    assert kv is not None and kv.kv_capacity_tokens == 75_840 and kv.max_concurrency == 2.48


def test_tp_and_ep_layout_from_the_worker_names() -> None:
    assert parsed("tp4_ep_workers.log").layout == {"EP": 4, "TP": 4}


def test_the_weight_line_without_memory_model_runner_v2_and_0_10() -> None:
    found = parsed("v2_runner_model_loading.log")
    assert (found.weights_gib, found.weights_load_s) == (7.64, 32.969258)
    old = parsed("v0_10_rank_and_loading.log")
    assert (old.weights_gib, old.weights_load_s) == (2.2845, 74.270197)
    assert old.layout is None  # world size 1


def test_gpu_kv_tokens_concurrency_and_the_graph_pool_line() -> None:
    found = parsed("cuda_graph_pool.log")
    assert (found.kv_tokens, found.max_concurrency) == (396_928, 3.03)
    assert (found.cuda_graph_capture_s, found.cuda_graph_gib) == (2.0, 0.11)


def test_dp_tp_and_ep_from_a_worker_name() -> None:
    # One line of a DP x TP x EP fleet: the highest ranks it names, not a guess at the rest.
    assert parsed("dp_tp_ep_worker.log").layout == {"DP": 2, "EP": 4, "TP": 2}


def test_vllm_0_32_rank_line_and_one_line_kv_report() -> None:
    # The real vLLM 0.32.0 log (CPU): PCP, ETP and EPLB ranks on the rank line, "EP rank N/A",
    # and the KV size and concurrency on one line, which is the CPU's, not a GPU fact.
    text = (Path(__file__).parents[1] / "fixtures" / "vllm" / "startup_ok.log").read_text()
    kv = parse_kv_capacity(text)
    assert kv == KvCapacity(93_184, 2_048, 45.5)
    found = parse_gpu_startup(text)
    assert found.layout is None and found.kv_tokens is None and not found.found


def test_vllm_0_32_rank_lines_of_a_tp_ep_replica() -> None:
    # Built from vLLM 0.32.0's format (distributed/parallel_state.py: "rank %s in world size %s
    # is assigned as DP rank %s, PP rank %s, PCP rank %s, TP rank %s, ETP rank %s, EP rank %s,
    # EPLB rank %s"): no public GPU log of 0.32 quotes it for more than one rank yet.
    lines = "".join(
        f"(Worker_TP{r}_EP{r} pid={100 + r}) INFO 11-29 10:03:27 [parallel_state.py:2350] rank "
        f"{r} in world size 4 is assigned as DP rank 0, PP rank 0, PCP rank 0, TP rank {r}, "
        f"ETP rank {r}, EP rank {r}, EPLB rank N/A\n"
        for r in range(4)
    )
    assert parse_gpu_startup(lines).layout == {"EP": 4, "TP": 4}
    one_line_kv = (
        "(EngineCore pid=9) INFO 11-29 10:03:30 [kv_cache_utils.py:2327] GPU KV cache size: "
        "1,587,648 tokens, Maximum concurrency for 2,048 tokens per request: 775.22x\n"
    )
    found = parse_gpu_startup(lines + one_line_kv)
    assert (found.kv_tokens, found.max_concurrency) == (1_587_648, 775.22)


def test_a_cpu_log_has_no_gpu_facts() -> None:
    found = parse_gpu_startup("INFO [kv_cache_utils.py] CPU KV cache size: 93,184 tokens\n")
    assert not found.found and found.layout is None


def test_up_prints_what_the_gpu_log_said() -> None:
    gpu = parsed("tp1_graph_capture.log")
    info = ReplicaInfo("r0", "http://127.0.0.1:9", 1, Path("r0.log"), None, 42.0, gpu)
    assert up.ready_line(info) == (
        "replica r0 ready at http://127.0.0.1:9 in 42 s (KV capacity not reported; "
        "CUDA graphs 0.11 GiB in 5 s, KV 6.13 GiB per GPU)"
    )
