"""The startup-log parser on real vLLM GPU logs (tests/data/vllm_logs, sources in its
README): weight memory, CUDA graph capture, TP/EP layout, KV per GPU."""

from __future__ import annotations

from pathlib import Path

from servepilot.engine.process import ReplicaInfo
from servepilot.engine.startup_log import GpuStartup, parse_gpu_startup, parse_kv_capacity
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
