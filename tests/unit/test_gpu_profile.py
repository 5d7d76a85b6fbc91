"""GPU operator profiles: the shapes `servepilot profile` times, the profile tables, and step
times composed from them (the profiler that times the shapes: test_gpu_profiler.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servepilot.cli.main import main
from servepilot.core.errors import ConfigError
from servepilot.plan.costmodel import CostModel, StepShape, fit_cost_model, prefill_pairs
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.gpu_profile.compose import Operating, StepComposer, composer, linearize
from servepilot.plan.gpu_profile.shapes import TOKEN_GRID, step_operators
from servepilot.plan.gpu_profile.table import (
    PROFILE_SCHEMA,
    Curve,
    gpu_profile_from,
    load_gpu_profile,
)
from servepilot.plan.hardware import get_accelerator
from servepilot.plan.presets import load_preset

REPO = Path(__file__).resolve().parents[2]
H200_LLAMA = REPO / "benchmarks/gpu_profiles/h200-llama-3.1-8b-bf16.json"


def _ops(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {op["name"]: op for op in doc["operators"]}


# ---- shapes -------------------------------------------------------------------------------


def test_llama_8b_shapes_are_its_linears_attention_and_head() -> None:
    ops = _ops(step_operators(load_preset("llama-3.1-8b")))
    # 32 query heads + 2 x 8 KV heads of 128: 6,144 outputs; MLP 14,336 wide; vocab 128,256.
    assert (ops["qkv_proj"]["k"], ops["qkv_proj"]["n"], ops["qkv_proj"]["count"]) == (
        4096, 6144, 32)  # fmt: skip
    assert (ops["o_proj"]["k"], ops["o_proj"]["n"]) == (4096, 4096)
    assert (ops["gate_up_proj"]["n"], ops["down_proj"]["k"]) == (2 * 14336, 14336)
    assert ops["lm_head"]["n"] == 128256 and ops["lm_head"]["axis"] == "sampled"
    assert ops["rmsnorm"]["count"] == 65  # two per layer and the final one
    decode = ops["attn_decode"]
    assert (decode["heads"], decode["kv_heads"], decode["qk_dim"]) == (32, 8, 128)
    assert all(p["batch"] * p["context"] <= 2**22 for p in decode["points"])
    assert [p["tokens"] for p in ops["qkv_proj"]["points"]] == list(TOKEN_GRID)
    assert TOKEN_GRID[0] == 1 and TOKEN_GRID[-1] == 8192 and len(TOKEN_GRID) == 26


def test_deepseek_v3_at_tp8_has_mla_latent_shapes_and_moe_experts() -> None:
    doc = step_operators(load_preset("deepseek-v3"), dtype=WeightDtype.FP8, tp=8)
    ops = _ops(doc)
    assert (doc["dtype"], doc["tp"]) == ("fp8", 8)
    # 128 heads / 8 = 16 per rank; decode reads the 512 + 64 latent, values its 512 dims.
    mla = ops["mla_decode"]
    assert (mla["heads"], mla["kv_heads"], mla["qk_dim"], mla["v_dim"], mla["latent"]) == (
        16, 1, 576, 512, True)  # fmt: skip
    assert (ops["mla_prefill"]["qk_dim"], ops["mla_prefill"]["v_dim"]) == (192, 128)
    assert (ops["w_uk"]["groups"], ops["w_uk"]["axis"]) == (16, "decode")
    assert ops["kv_b_proj"]["axis"] == "prefill"
    assert ops["qkv_a_proj"]["n"] == 1536 + 576  # replicated: not divided by tp
    experts = ops["experts"]
    assert (experts["experts"], experts["top_k"], experts["n"], experts["count"]) == (
        256, 8, 2048 // 8, 58)  # fmt: skip
    assert (ops["gate_up_proj"]["count"], ops["gate_up_proj"]["n"]) == (3, 2 * 18432 // 8)
    assert ops["router"]["fp8"] is False and ops["lm_head"]["n"] == 129280 // 8


def test_tp_must_divide_the_heads() -> None:
    with pytest.raises(ValueError, match="divide"):
        step_operators(load_preset("llama-3.1-8b"), tp=3)


# ---- tables and composition ---------------------------------------------------------------


def test_a_curve_interpolates_linearly_and_extrapolates_in_proportion() -> None:
    curve = Curve((1.0, 100.0, 1000.0), (10e-6, 10e-6, 100e-6))
    assert curve.at(0) == 0.0
    assert curve.at(0.5) == 10e-6  # no cheaper than the smallest measured
    assert curve.at(550.0) == pytest.approx(55e-6)
    assert curve.at(2000.0) == pytest.approx(200e-6)


def _known_profile() -> dict[str, Any]:
    """Two linears (a flat and a linear one), a head, decode and prefill attention."""
    return {
        "schema": PROFILE_SCHEMA, "model": "llama-3.1-8b", "dtype": "bf16",
        "tp": 1, "gpu": "Test GPU", "torch": "2.x", "cuda": "13.0", "date": "2026-12-01T00:00Z",
        "operators": [
            {"name": "flat", "kind": "gemm", "axis": "tokens", "count": 10, "k": 1, "n": 1,
             "points": [{"tokens": 1, "us": 50}, {"tokens": 256, "us": 50},
                        {"tokens": 1024, "us": 200}]},
            {"name": "head", "kind": "gemm", "axis": "sampled", "count": 1, "k": 1, "n": 1,
             "points": [{"tokens": 1, "us": 100}, {"tokens": 64, "us": 100}]},
            {"name": "dec", "kind": "attn_decode", "count": 10, "heads": 1, "kv_heads": 1,
             "qk_dim": 1, "v_dim": 1,
             "points": [{"batch": 1, "context": 1000, "us": 5},
                        {"batch": 1, "context": 2000, "us": 9},
                        {"batch": 4, "context": 1000, "us": 11},
                        {"batch": 4, "context": 2000, "us": 21}]},
            {"name": "pre", "kind": "attn_prefill", "count": 10, "heads": 1, "kv_heads": 1,
             "qk_dim": 1, "v_dim": 1,
             "points": [{"tokens": 15, "us": 12}, {"tokens": 255, "us": 300}]},
        ],
    }  # fmt: skip


def test_a_known_operator_table_gives_a_known_step_time() -> None:
    table = gpu_profile_from(_known_profile(), "test")
    step = StepComposer(table, comm_token_s=0.0, comm_step_s=0.0, step_overhead_s=1e-3,
                        seq_overhead_s=1e-5)  # fmt: skip
    # Decode only: 2 sequences at 1,500 tokens of context each.
    # flat 10 x 50 + head 100 + attention 10 x (batch 2 between 1 and 4 at context 1,500:
    # 7 + (16 - 7) / 3 = 10) = 700 us; + 1 ms + 2 x 10 us.
    decode = StepShape(0, 0, 2, 3000, 0)
    assert step.step_time_s(decode) == pytest.approx(700e-6 + 1e-3 + 20e-6)
    # A prefill of 255 tokens alone: flat 10 x 50 (255 < 256) + head 100 + 10 x 300 us
    # (255 x 256 / 2 pairs, the measured point) = 3,600 us; + 1 ms + 10 us.
    prefill = StepShape(255, 1, 0, 0, 255 * 256 // 2)
    assert step.step_time_s(prefill) == pytest.approx(3600e-6 + 1e-3 + 10e-6)
    # 640 tokens: the flat linear interpolates to 50 + 150 x 384 / 768 = 125 us.
    assert step.gpu_time_s(StepShape(640, 1, 0, 0, 0)) == pytest.approx(1250e-6 + 100e-6)


def test_tp_communication_comes_from_the_catalog_link() -> None:
    doc = _known_profile() | {"model": "llama-3.1-70b", "tp": 4}
    step = composer(gpu_profile_from(doc, "t"), load_preset("llama-3.1-70b"),
                    get_accelerator("h200"), tp=4, where="t")  # fmt: skip
    # 2 all-reduces x 80 layers x 8,192 x 2 bytes x 2 x 3/4 per token over 450 GB/s one way,
    # 10 us latency each.
    assert step.comm_token_s == pytest.approx(160 * 8192 * 2 * 1.5 / 450e9)
    assert step.comm_step_s == pytest.approx(160 * 10e-6)


def test_a_profile_of_another_model_or_tp_is_refused() -> None:
    table = gpu_profile_from(_known_profile(), "t")
    h200 = get_accelerator("h200")
    with pytest.raises(ConfigError, match=r"profile is of llama-3\.1-8b"):
        composer(table, load_preset("qwen3-32b"), h200, tp=1, where="t")
    with pytest.raises(ConfigError, match="tp 2"):
        composer(table, load_preset("llama-3.1-8b"), h200, tp=2, where="t")
    with pytest.raises(ConfigError, match="times bf16 weights; the fleet runs fp8"):
        composer(table, load_preset("llama-3.1-8b"), h200, tp=1, where="t",
                 weights=WeightDtype.FP8)  # fmt: skip


def test_the_measured_h200_profile_linearizes_within_a_few_percent() -> None:
    table = load_gpu_profile(H200_LLAMA)
    assert table.gpu == "NVIDIA H200" and table.date.startswith("2026-12-01")
    step = composer(table, load_preset("llama-3.1-8b"), get_accelerator("h200"), tp=1,
                    where="t")  # fmt: skip
    fitted = linearize(step, Operating(1000, 1000, 256, 8192))
    assert fitted.median_error < 0.03 and fitted.max_error < 0.15
    # Decode alone is bound by reading 16 GB of weights: measured at ~3.4 TB/s, not 4.8.
    one = step.gpu_time_s(StepShape(0, 0, 1, 1024, 0))
    assert 4.2e-3 < one < 5.2e-3


def test_a_long_prompts_chunks_are_fitted_when_the_replica_may_be_sent_one() -> None:
    """Linearized around 512-token prompts alone, the fit's attention term came from chunks
    where attention is launch-bound, and a 32,000-token prompt's four 8,192-token chunks
    came out 4.4x the composition (on the H100: 9.3 s predicted, 1.26 s measured)."""
    step = composer(load_gpu_profile(H200_LLAMA), load_preset("llama-3.1-8b"),
                    get_accelerator("h200"), tp=1, where="t")  # fmt: skip
    chunks = [StepShape(8192, 1, 0, 0, prefill_pairs(8192, k * 8192)) for k in range(4)]
    composed = sum(step.step_time_s(c) for c in chunks)
    short = linearize(step, Operating(512, 256, 256, 8192)).model
    wide = linearize(step, Operating(512, 256, 256, 8192, max_context_tokens=33792)).model
    # Once 4.4x; with the token operators as measured only attention is left to the fit.
    assert sum(short.step_time_s(c) for c in chunks) == pytest.approx(composed, rel=0.25)
    assert sum(wide.step_time_s(c) for c in chunks) == pytest.approx(composed, rel=0.15)


def test_sim_and_plan_take_a_gpu_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("model: {source: llama-3.1-8b}\nhardware: {accelerator: h200, count: 1}\n")
    out = tmp_path / "out"
    assert main(["sim", "-c", str(fleet), "--profile", str(H200_LLAMA), "--concurrency", "4",
                 "--requests", "8", "--input-tokens", "512", "--output-tokens", "16",
                 "--out", str(out)]) == 0  # fmt: skip
    target = json.loads((out / "results.json").read_text())["target"]
    assert target["cost_model"]["kind"] == "gpu profile"
    assert target["cost_model"]["source"].startswith("gpu profile: NVIDIA H200")
    capsys.readouterr()
    assert main(["plan", "--model", "llama-3.1-8b", "--accelerator", "h200", "--count", "1",
                 "--profile", str(H200_LLAMA), "--json"]) == 0  # fmt: skip
    plan = json.loads(capsys.readouterr().out)
    assert "gpu profile: NVIDIA H200" in json.dumps(plan)


def test_composed_decode_steps_match_a_whole_forward_timed_on_the_h200() -> None:
    """benchmarks/gpu_forward_check.py timed Llama-3.1-8B's whole decode step (32 layers in
    one CUDA graph) on the same H200: the sum of the isolated operators is within 5% of it
    (short by the residual adds the profile leaves out)."""
    table = load_gpu_profile(H200_LLAMA)
    step = StepComposer(table, comm_token_s=0.0, comm_step_s=0.0)
    forward = json.loads((H200_LLAMA.parent / "h200-llama-3.1-8b-bf16-forward.json").read_text())
    assert forward["gpu"] == table.gpu and len(forward["points"]) == 7
    for point in forward["points"]:
        batch, context = point["batch"], point["context"]
        composed = step.gpu_time_s(StepShape(0, 0, batch, batch * context, 0))
        assert composed / (point["us"] * 1e-6) - 1 == pytest.approx(-0.03, abs=0.02)


def test_tune_on_the_simulator_takes_a_gpu_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "model: {source: llama-3.1-8b}\nhardware: {accelerator: h200, count: 1, device: gpu}\n"
    )
    out = tmp_path / "tune"
    assert main(["tune", "-c", str(fleet), "--engine", "sim", "--profile", str(H200_LLAMA),
                 "--input-tokens", "512", "--output-tokens", "32", "--requests", "20",
                 "--budget", "1", "--slo", "ttft_p99_ms=2000,tpot_p99_ms=50",
                 "--out", str(out)]) == 0  # fmt: skip
    trial = json.loads((out / "trials.jsonl").read_text().splitlines()[0])
    # Alone on the replica, a decode step of the 8B model on the H200: ~4.8 ms of operators
    # plus 1 ms of CPU overhead (the roofline would say 4.8 in all).
    tpot = trial["outcome"]["runs"][0]["tpot_ms"]["p50"]
    assert 5.5 < tpot < 6.2


# ---- token operators: as measured, not a line ------------------------------------------------

H100 = REPO / "benchmarks/gpu_runs/2026-12-05-sim-validate-h100/profiles"


def _h100(model: str, dtype: str) -> StepComposer:
    return composer(load_gpu_profile(H100 / f"h100-{model}-{dtype}.json"), load_preset(model),
                    get_accelerator("h100-80"), tp=1, where="t",
                    weights=WeightDtype(dtype))  # fmt: skip


def test_a_burst_of_prompts_in_one_step_costs_what_its_operators_say() -> None:
    """A closed loop's start puts eight 1,000-token prompts in one 8,192-token step. A line
    through the traffic's steps had its per-token cost from where the linears read their
    weights whatever the tokens (a floor), and put that step at 97 ms where the operators
    say 118 (the H100 ran such steps about 125 ms apart)."""
    step = _h100("llama-3.1-8b", "fp8")
    at = Operating(1000, 200, 256, 8192, 8192)
    model = linearize(step, at).model
    burst = StepShape(8192, 8, 0, 0, 8 * prefill_pairs(1024, 0))
    shapes = [burst, StepShape(1000, 1, 0, 0, prefill_pairs(1000, 0)), StepShape(0, 0, 1, 1100, 0),
              StepShape(0, 0, 64, 64 * 1100, 0), StepShape(1000, 1, 63, 63 * 1100,
              prefill_pairs(1000, 0))]  # fmt: skip
    for shape in shapes:
        assert model.step_time_s(shape) == pytest.approx(step.step_time_s(shape), rel=0.03)
    assert step.step_time_s(burst) == pytest.approx(0.118, rel=0.02)
    line = fit_cost_model([(s, step.step_time_s(s)) for s in _samples(at)], source="line")
    assert line.step_time_s(burst) < 0.9 * step.step_time_s(burst)


def _samples(at: Operating) -> list[StepShape]:
    from servepilot.plan.gpu_profile import compose

    return list(compose._operating_steps(at))


def test_moe_experts_fill_in_as_a_decode_batch_grows() -> None:
    """DeepSeek-V2-Lite's routed experts: one token reads 6 of 64, sixteen read most of
    them; the table keeps that curve, which no line through a floor does."""
    step = _h100("deepseek-v2-lite", "bf16")
    model = linearize(step, Operating(1000, 200, 256, 8192, 16384)).model
    for batch in (1, 4, 16, 64):
        decode = StepShape(0, 0, batch, batch * 1100, 0)
        assert model.step_time_s(decode) == pytest.approx(step.step_time_s(decode), rel=0.03)
    assert step.token_ops_s(16) > 3 * step.token_ops_s(1)


def test_the_token_table_interpolates_and_extrapolates_in_proportion() -> None:
    model = CostModel(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "t", token_table_s=(0.0, 1.0, 3.0))
    assert model.token_ops_s(1) == 1.0 and model.token_ops_s(1.5) == 2.0
    assert model.token_ops_s(4) == 6.0  # past the end: proportional to the last entry
    assert CostModel(1.0, 0.0, 0.0, 0.0, 0.0, 0.0, "t").token_ops_s(100) == 0.0
    assert model.step_time_s(StepShape(1, 1, 1, 0, 0)) == 3.0  # 2 tokens


def test_a_profiles_meta_carries_the_fitted_step_overhead() -> None:
    document = json.loads((H100 / "h100-llama-3.1-8b-bf16.json").read_text())
    fitted = gpu_profile_from({**document, "meta": {"step_overhead_ms": 0.25}}, "t")
    assert fitted.step_overhead_s == 0.00025
    assert gpu_profile_from({**document, "meta": {}}, "t").step_overhead_s is None
    with pytest.raises(ConfigError, match="step_overhead_ms"):
        gpu_profile_from({**document, "meta": {"step_overhead_ms": -1}}, "t")


def test_a_prefill_scale_multiplies_what_the_prefill_adds_and_nothing_else() -> None:
    document = _known_profile()
    plain = StepComposer(gpu_profile_from(document, "t"), comm_token_s=0.0, comm_step_s=0.0)
    scaled_doc = {**document, "meta": {"prefill_scale": 3.0}}
    scaled = StepComposer(gpu_profile_from(scaled_doc, "t"), comm_token_s=0.0, comm_step_s=0.0)
    # Decode alone: nothing to scale (700 us, as in the known step above).
    decode = StepShape(0, 0, 2, 3000, 0)
    assert scaled.gpu_time_s(decode) == plain.gpu_time_s(decode) == pytest.approx(700e-6)
    # A prefill of 255 tokens alone: 3,600 us of operators, 3 x that.
    prefill = StepShape(255, 1, 0, 0, 255 * 256 // 2)
    assert scaled.gpu_time_s(prefill) == pytest.approx(3 * 3600e-6)
    # Both in one step: the decoders' part as alone, what the chunk adds beside them x 3.
    # (Decode attention takes the step's context per sequence: 4,500 / 3 = 1,500, as alone.)
    mixed = StepShape(255, 1, 2, 4500, 255 * 256 // 2)
    added = plain.gpu_time_s(mixed) - plain.gpu_time_s(decode)
    assert added > 0
    assert scaled.gpu_time_s(mixed) == pytest.approx(plain.gpu_time_s(decode) + 3 * added)
    assert gpu_profile_from(document, "t").prefill_scale == 1.0
    with pytest.raises(ConfigError, match="prefill_scale"):
        gpu_profile_from({**document, "meta": {"prefill_scale": 0}}, "t")


def test_decode_attention_as_vllm_ran_it_corrects_the_operators_decode_attention_only() -> None:
    """The known decode step: 600 us of flat linears and head, 100 us of decode attention
    (10 x 10 us). With vLLM's decode attention traced as 150 us + 0.5 x the operators': 650 +
    600 us. A prefill alone has no decode attention: unchanged."""
    document = _known_profile()
    meta = {"decode_attention_us": 150.0, "decode_attention_scale": 0.5}
    traced = gpu_profile_from({**document, "meta": meta}, "t")
    assert (traced.decode_attention_fixed_s, traced.decode_attention_scale) == (150e-6, 0.5)
    step = StepComposer(traced, comm_token_s=0.0, comm_step_s=0.0)
    assert step.gpu_time_s(StepShape(0, 0, 2, 3000, 0)) == pytest.approx(600e-6 + 200e-6)
    assert step.decode_attention_s(2, 1500) == pytest.approx(200e-6)
    prefill = StepShape(255, 1, 0, 0, 255 * 256 // 2)
    assert step.gpu_time_s(prefill) == pytest.approx(3600e-6)
    plain = gpu_profile_from(document, "t")
    assert (plain.decode_attention_fixed_s, plain.decode_attention_scale) == (0.0, 1.0)
    with pytest.raises(ConfigError, match="decode_attention_scale"):
        gpu_profile_from({**document, "meta": {"decode_attention_scale": 0}}, "t")
