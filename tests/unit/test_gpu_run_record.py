"""servepilot/engine/gpu/run_record.py: a GPU run's record from vLLM's startup log, checked against
the schema of benchmarks/gpu_runs/README.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servepilot.engine.gpu.run_record import build_record, parser, validate, write

# vLLM 0.22.0 on the H200, Llama-3.1-8B dummy at max_model_len 8,192 (reference/gpu-bringup.md).
LOG = """\
(EngineCore pid=812) INFO 12-04 10:01:02 [gpu_model_runner.py:2602] Model loading took 14.99 GiB and 3.1 seconds
(EngineCore pid=812) INFO 12-04 10:01:40 [gpu_worker.py:625] Available KV cache memory: 108.20 GiB
(EngineCore pid=812) INFO 12-04 10:01:40 [kv_cache_utils.py:1087] GPU KV cache size: 886,368 tokens
(EngineCore pid=812) INFO 12-04 10:01:40 [kv_cache_utils.py:1091] Maximum concurrency for 8,192 tokens per request: 108.20x
(EngineCore pid=812) INFO 12-04 10:01:47 [gpu_model_runner.py:3480] Graph capturing finished in 7 secs, took 0.64 GiB
"""  # noqa: E501


def args(tmp_path: Path, *extra: str) -> list[str]:
    log = tmp_path / "r0.log"
    log.write_text(LOG, encoding="utf-8")
    return ["--name", "llama-8b-dummy", "--date", "2026-12-04", "--vllm-version", "0.22.0",
            "--gpu", "NVIDIA H200", "--model", "llama-3.1-8b", "--weights", "dummy",
            "--dtype", "bfloat16", "--kv-tokens-planned", "893712", "--ready-s", "95",
            "--log", str(log), "--command", "servepilot up -c fleet.yaml", *extra]  # fmt: skip


def test_the_record_takes_vllms_figures_from_its_log(tmp_path: Path) -> None:
    record = build_record(parser().parse_args(args(tmp_path, "--soak", "500", "2.1")), LOG)
    assert validate(record) == []
    assert record["kv_tokens_reported"] == 886_368
    assert record["kv_error"] == pytest.approx(0.0083, abs=1e-4)  # plan's +0.8%
    assert record["startup"]["cuda_graph_capture_s"] == 7
    assert record["startup"]["kv_cache_gib"] == pytest.approx(108.2)
    assert record["soak"] == {"requests": 500, "gpu_mib_per_request": 2.1}
    assert record["weights"] == "dummy" and "sleep" not in record


def test_write_puts_the_logs_beside_the_json(tmp_path: Path) -> None:
    namespace = parser().parse_args(args(tmp_path))
    record = build_record(namespace, LOG)
    path = write(record, [tmp_path / "r0.log"], runs=tmp_path / "runs")
    assert path.name == "2026-12-04-llama-8b-dummy.json"
    assert json.loads(path.read_text())["logs"] == ["2026-12-04-llama-8b-dummy/r0.log"]
    assert (tmp_path / "runs" / "2026-12-04-llama-8b-dummy" / "r0.log").read_text() == LOG


def test_validation_names_each_bad_field(tmp_path: Path) -> None:
    record = build_record(parser().parse_args(args(tmp_path)), LOG)
    broken = {**record, "weights": "random", "ready_s": "95", "sleep": {"sleep_s": 1}, "x": 1}
    del broken["gpu"]
    problems = validate(broken)
    assert "gpu: missing" in problems
    assert any(p.startswith("weights:") for p in problems)
    assert any(p.startswith("ready_s:") for p in problems)
    assert "sleep: needs exactly sleep_s, wake_s, cold_start_s" in problems
    assert "x: not in the schema" in problems


def test_a_cpu_log_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="not a GPU startup log"):
        build_record(parser().parse_args(args(tmp_path)), "CPU KV cache size: 93,184 tokens\n")
