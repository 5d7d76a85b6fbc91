"""The GPU operator profiler (servepilot/engine/gpu/profiler.py): its logic on the CPU, its GPU
path where a GPU exists, `servepilot profile`'s exits, and the round trip with plan's side of
the format (the shapes it reads, the profile tables read back)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servepilot.cli.main import main
from servepilot.engine.gpu import profiler
from servepilot.plan.gpu_profile.shapes import SHAPES_SCHEMA, step_operators
from servepilot.plan.gpu_profile.table import PROFILE_SCHEMA, gpu_profile_from
from servepilot.plan.presets import load_preset, preset_names


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_enumerates_valid_shapes(name: str) -> None:
    doc = step_operators(load_preset(name))
    profiler.check_shapes(doc)
    for op in doc["operators"]:
        assert op["count"] >= 1
        assert all(v > 0 for k, v in op.items() if k in ("k", "n", "width", "heads", "qk_dim"))


def test_moe_load_spreads_tokens_over_the_experts_a_uniform_router_touches() -> None:
    assert profiler.moe_load(1, 256, 8) == (8, 1)  # one token: its 8 experts, 1 token each
    # 4,096 tokens x 8 picks over 256 experts touch all of them, 128 tokens each.
    assert profiler.moe_load(4096, 256, 8) == (256, 128)


# ---- the profiler, on the CPU ---------------------------------------------------------------


def _tiny_shapes() -> dict[str, Any]:
    attn = {"heads": 4, "kv_heads": 2, "qk_dim": 8, "v_dim": 8, "count": 1}
    return {
        "schema": SHAPES_SCHEMA, "model": "tiny", "dtype": "bf16", "tp": 1,
        "operators": [
            {"name": "lin", "kind": "gemm", "axis": "tokens", "k": 16, "n": 32, "count": 2,
             "points": [{"tokens": 1}, {"tokens": 8}]},
            {"name": "bmm", "kind": "gemm", "axis": "decode", "k": 8, "n": 16, "groups": 2,
             "count": 1, "points": [{"tokens": 2}]},
            {"name": "moe", "kind": "moe", "axis": "tokens", "experts": 4, "top_k": 2, "k": 16,
             "n": 8, "count": 1, "points": [{"tokens": 3}]},
            {"name": "norm", "kind": "rmsnorm", "axis": "tokens", "width": 16, "count": 3,
             "points": [{"tokens": 4}]},
            {"name": "act", "kind": "silu_mul", "axis": "tokens", "width": 16, "count": 1,
             "points": [{"tokens": 4}]},
            {"name": "dec", "kind": "attn_decode", **attn,
             "points": [{"batch": 1, "context": 16}, {"batch": 2, "context": 16}]},
            {"name": "lat", "kind": "attn_decode", **attn, "kv_heads": 1, "qk_dim": 12,
             "latent": True, "points": [{"batch": 2, "context": 8}]},
            {"name": "pre", "kind": "attn_prefill", **attn, "points": [{"tokens": 16}]},
        ],
    }  # fmt: skip


def test_the_profiler_times_every_point_and_writes_the_schema_on_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps(_tiny_shapes()))
    out = tmp_path / "profile.json"
    assert profiler.main(["--shapes", str(shapes), "--out", str(out), "--device", "cpu"]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == PROFILE_SCHEMA and doc["gpu"].startswith("cpu")
    assert {"torch", "cuda", "date", "method", "elapsed_s"} <= set(doc)
    points = [p for op in doc["operators"] for p in op["points"]]
    assert len(points) == 10 and all(p["us"] > 0 for p in points)
    table = gpu_profile_from(doc, "test")
    assert [op.name for op in table.token_ops] == ["lin", "bmm", "moe", "norm", "act"]
    assert [op.name for op in table.decode_attention] == ["dec", "lat"]


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _cuda(), reason="no CUDA GPU here: the GPU path runs where one is")
def test_the_profiler_times_on_the_gpu(tmp_path: Path) -> None:
    doc = profiler.run_profile(_tiny_shapes(), device="cuda", log=lambda _: None)
    assert all(p["us"] > 0 for op in doc["operators"] for p in op["points"])


def test_without_a_gpu_profile_says_so_and_exits_3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "p.json"
    assert main(["profile", "--model", "llama-3.1-8b", "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert "no CUDA GPU" in err and "Traceback" not in err and not out.exists()


def test_shapes_only_writes_what_the_stand_alone_profiler_reads(tmp_path: Path) -> None:
    out = tmp_path / "shapes.json"
    assert main(["profile", "--model", "deepseek-v3", "--dtype", "fp8", "--tp", "8",
                 "--shapes-only", "--out", str(out)]) == 0  # fmt: skip
    profiler.check_shapes(json.loads(out.read_text()))


def test_bad_shapes_exit_2(tmp_path: Path) -> None:
    shapes = tmp_path / "s.json"
    shapes.write_text('{"schema": "other"}')
    assert profiler.main(["--shapes", str(shapes), "--out", str(tmp_path / "o.json")]) == 2
