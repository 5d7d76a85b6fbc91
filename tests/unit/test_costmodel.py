"""The step cost model (servepilot/plan/costmodel.py): roofline numbers for known cases,
fitting recovers known coefficients, profile files round-trip and bad ones are named."""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from servepilot.core.errors import ConfigError
from servepilot.plan import costmodel as cm
from servepilot.plan.costmodel import (
    CostModel,
    StepShape,
    active_params,
    fit_cost_model,
    nnls,
    prefill_pairs,
    roofline_cost_model,
)
from servepilot.plan.costprofile import load_profile, save_profile
from servepilot.plan.dtypes import WeightDtype
from servepilot.plan.hardware import get_accelerator, with_overrides
from servepilot.plan.memory import weight_bytes
from servepilot.plan.parallel import Parallelism
from servepilot.plan.presets import load_preset

LLAMA_8B_KV_BYTES = 32 * 8 * 128 * 2 * 2  # layers x KV heads x head_dim x (K, V) x bf16


def _llama_8b_h100(tp: int = 1) -> CostModel:
    return roofline_cost_model(
        load_preset("llama-3.1-8b"),
        get_accelerator("h100"),
        weights_dtype=WeightDtype.BF16,
        kv_bytes_per_token=LLAMA_8B_KV_BYTES / tp,
        tp=tp,
    )


# ---- roofline ------------------------------------------------------------------------


def test_llama_8b_on_h100_reads_its_weights_once_per_step() -> None:
    model = _llama_8b_h100()
    weights_s = model.base_s - cm.GPU_STEP_OVERHEAD_S
    # 8.03B parameters in bf16 (~15-16 GB) at 3.35 TB/s: about 4.5-4.8 ms.
    assert 4.4e-3 < weights_s < 4.9e-3
    assert model.source == "roofline: h100-80/llama-3.1-8b"


def test_llama_8b_on_h100_token_costs() -> None:
    model = _llama_8b_h100()
    spec = load_preset("llama-3.1-8b")
    # Without the embedding and the LM head (counted per sampled sequence): ~6.98B.
    active = active_params(spec)
    assert 6.9e9 < active < 7.1e9
    assert model.per_prefill_token_s == pytest.approx(2 * active / 989.4e12)
    head_s = 2 * 128_256 * 4096 / 989.4e12
    assert model.per_prefill_seq_s == pytest.approx(head_s + cm.GPU_SEQ_OVERHEAD_S)
    assert model.per_decode_seq_s == pytest.approx(
        model.per_prefill_token_s + head_s + cm.GPU_SEQ_OVERHEAD_S
    )
    assert model.per_context_token_s == pytest.approx(131_072 / 3.35e12)
    # QK^T and PV: 2 x 2 x 32 heads x 128 per layer, 32 layers.
    assert model.per_prefill_pair_s == pytest.approx(32 * 4 * 32 * 128 / 989.4e12)


def test_mla_prefill_attention_counts_unabsorbed_heads() -> None:
    spec = load_preset("deepseek-v3")
    model = roofline_cost_model(
        spec, get_accelerator("h200"), weights_dtype=WeightDtype.FP8, kv_bytes_per_token=656
    )
    # 61 layers x 128 heads x 2 x (128 nope + 64 rope + 128 v) FLOPs, at H200's measured
    # fp8 rate (1,285 TFLOP/s, not the datasheet's 1,979).
    flops = 1285.0e12
    assert model.per_prefill_pair_s == pytest.approx(61 * 128 * 2 * (128 + 64 + 128) / flops)


def test_the_roofline_uses_measured_ceilings_where_the_catalog_has_them() -> None:
    h200, h100 = get_accelerator("h200"), get_accelerator("h100")
    assert h200.ceilings.startswith("measured: ") and h100.ceilings == "datasheet"
    spec = load_preset("llama-3.1-8b")
    model = roofline_cost_model(spec, h200, weights_dtype=WeightDtype.BF16, kv_bytes_per_token=0)
    # 16.06 GB of bf16 weights at the measured 4,248 GB/s, plus the 1 ms step overhead.
    assert model.base_s == pytest.approx(
        weight_bytes(spec, WeightDtype.BF16, Parallelism()).per_rank / 4.248e12 + 1e-3
    )
    # bf16 compute at the measured 687 TFLOP/s; AWQ runs weight-only at the same 16-bit rate.
    assert h200.roofline_flops_for(WeightDtype.BF16) == 687.0e12
    assert h200.roofline_flops_for(WeightDtype.AWQ) == 687.0e12
    assert h100.roofline_flops_for(WeightDtype.BF16) == h100.bf16_flops
    # A user's bandwidth override replaces the measured figure too.
    slower = with_overrides(h200, hbm_bandwidth_gb_s=3000.0)
    assert slower.roofline_bandwidth_bytes_per_s == 3000.0e9


def test_prefill_pairs_count_a_chunks_causal_attention() -> None:
    assert prefill_pairs(1, 0) == 1
    assert prefill_pairs(4, 0) == 1 + 2 + 3 + 4
    # Two chunks of 4 cover the same pairs as one chunk of 8.
    assert prefill_pairs(4, 0) + prefill_pairs(4, 4) == prefill_pairs(8, 0) == 36


def test_deepseek_v3_active_params_count_eight_of_256_experts() -> None:
    # The model card: 37B activated, 0.9B of them the embedding and 0.9B the head.
    active = active_params(load_preset("deepseek-v3"))
    assert active == pytest.approx(37e9 - 1.85e9, rel=0.02)


def test_tensor_parallel_splits_weights_and_flops_and_pays_all_reduces() -> None:
    one, eight = _llama_8b_h100(), _llama_8b_h100(tp=8)
    weights_1 = one.base_s - cm.GPU_STEP_OVERHEAD_S
    weights_8 = eight.base_s - cm.GPU_STEP_OVERHEAD_S - 2 * 32 * cm.ALLREDUCE_LATENCY_S
    assert weights_8 == pytest.approx(weights_1 / 8, rel=0.05)  # the embedding is split too
    # Two all-reduces per layer of 4,096 bf16 activations; a ring sends 2 x 7/8 of them
    # one way over NVLink (900 GB/s both ways).
    all_reduce_s = 32 * 2 * 4096 * 2 * 2 * 7 / 8 / 450e9
    assert eight.per_prefill_token_s == pytest.approx(one.per_prefill_token_s / 8 + all_reduce_s)
    assert eight.per_context_token_s == pytest.approx(one.per_context_token_s / 8)


def test_cpu_roofline_uses_the_cpu_overheads() -> None:
    model = roofline_cost_model(
        load_preset("smollm2"),
        get_accelerator("cpu"),
        weights_dtype=WeightDtype.BF16,
        kv_bytes_per_token=23_040,
    )
    assert model.base_s > cm.CPU_STEP_OVERHEAD_S
    assert model.per_prefill_seq_s > cm.CPU_SEQ_OVERHEAD_S


def test_step_time_is_linear_in_the_shape() -> None:
    model = CostModel(0.01, 1e-4, 1e-3, 2e-3, 1e-6, 1e-8, "test")
    shape = StepShape(
        prefill_tokens=100,
        prefill_seqs=2,
        decode_seqs=3,
        context_tokens=1000,
        prefill_pairs=50_000,
    )
    assert model.step_time_s(shape) == pytest.approx(0.01 + 0.01 + 0.002 + 0.006 + 0.001 + 5e-4)
    assert model.step_time_s(StepShape(0, 0, 0, 0, 0)) == 0.01


def test_a_step_without_a_cuda_graph_takes_at_least_the_hosts_launch_time() -> None:
    model = CostModel(0.01, 1e-5, 0.0, 1e-4, 0.0, 0.0, "test", eager_floor_s=0.05,
                      eager_mixed_floor_s=0.07, graph_max_tokens=512)  # fmt: skip
    # 512 tokens run as a graph: the linear time, 10 + 5.12 ms.
    assert model.step_time_s(StepShape(512, 1, 0, 0, 0)) == pytest.approx(0.01512)
    # 513 run eagerly: the host's 50 ms, which the GPU's 15.13 ms waits for.
    assert model.step_time_s(StepShape(513, 1, 0, 0, 0)) == 0.05
    # An eager step longer than the floor keeps its own time: 10 + 50 ms.
    assert model.step_time_s(StepShape(5000, 1, 0, 0, 0)) == pytest.approx(0.06)
    # Decoders count as tokens of the step: 500 + 13 > 512; and they launch the decode
    # path's kernels too, the mixed floor.
    assert model.step_time_s(StepShape(500, 1, 13, 0, 0)) == 0.07
    assert CostModel(0.01, 1e-5, 0.0, 0.0, 0.0, 0.0, "t").step_time_s(
        StepShape(513, 1, 0, 0, 0)
    ) == pytest.approx(0.01513)  # no floor by default


# ---- fitting -------------------------------------------------------------------------

TRUE = CostModel(4e-3, 2e-5, 1.5e-4, 3e-4, 4e-8, 2e-10, "truth")


def _samples(count: int, seed: int = 0, noise: float = 0.0) -> list[tuple[StepShape, float]]:
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        seqs = rng.randint(0, 4)
        chunks = [rng.randint(1, 1000) for _ in range(seqs)]
        cached = [rng.choice((0, 0, rng.randint(1, 2000))) for _ in range(seqs)]
        shape = StepShape(
            prefill_tokens=sum(chunks),
            prefill_seqs=seqs,
            decode_seqs=rng.randint(0, 200),
            context_tokens=rng.randint(0, 300_000) + sum(cached),
            prefill_pairs=sum(map(prefill_pairs, chunks, cached)),
        )
        samples.append((shape, TRUE.step_time_s(shape) * (1 + rng.uniform(-noise, noise))))
    return samples


def test_fit_recovers_known_coefficients() -> None:
    model = fit_cost_model(_samples(200), source="calibrated: test")
    for got, want in zip(model.coefficients, TRUE.coefficients, strict=True):
        assert got == pytest.approx(want, rel=1e-6)
    assert model.source == "calibrated: test"


def test_fit_with_noise_stays_close() -> None:
    model = fit_cost_model(_samples(2000, seed=3, noise=0.03), source="x")
    assert model.base_s == pytest.approx(TRUE.base_s, rel=0.05)
    assert model.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=0.05)
    assert model.per_decode_seq_s == pytest.approx(TRUE.per_decode_seq_s, rel=0.05)
    assert model.per_context_token_s == pytest.approx(TRUE.per_context_token_s, rel=0.05)
    assert model.per_prefill_pair_s == pytest.approx(TRUE.per_prefill_pair_s, rel=0.05)


def test_fit_never_returns_negative_coefficients() -> None:
    # Steps where more context makes the step *faster*: unconstrained least squares would
    # give a negative coefficient; the fit clamps it at zero.
    samples = [
        (
            StepShape(p * s, s, d, c, s * prefill_pairs(p, 0)),
            0.01 + 1e-5 * p * s + 1e-4 * d - 1e-9 * c,
        )
        for p, s, d, c in itertools.product(
            (10, 500, 2000), (1, 2), (1, 50, 100), (0, 10_000, 50_000)
        )
    ]
    model = fit_cost_model(samples, source="x")
    assert min(model.coefficients) >= 0
    assert model.per_context_token_s == 0


def test_fit_sets_the_quadratic_term_to_zero_when_prefills_cannot_show_it() -> None:
    # Only two prompt lengths: their pairs are a mix of tokens and sequences, so the
    # quadratic term is not identifiable; the linear terms still are, and come out right.
    samples = [
        (
            StepShape(p * s, s, d, 100 * d + c, s * prefill_pairs(p, 0)),
            0.01 + 1e-5 * p * s + 2e-4 * s + 1e-4 * d + 1e-8 * (100 * d + c),
        )
        for p, s, d, c in itertools.product((10, 500), (1, 2), (1, 50, 100), (0, 10_000))
    ]
    model = fit_cost_model(samples, source="x")
    assert model.per_prefill_pair_s == 0
    assert model.per_prefill_token_s == pytest.approx(1e-5, rel=1e-6)
    assert model.per_prefill_seq_s == pytest.approx(2e-4, rel=1e-6)


def test_fit_refuses_too_few_distinct_samples() -> None:
    samples = _samples(5) * 10
    with pytest.raises(ValueError, match="5 distinct step shapes"):
        fit_cost_model(samples, source="x")


def test_fit_refuses_a_term_that_never_varies() -> None:
    samples = [(StepShape(0, 0, d, 1000 * d + 7, 0), 0.01 + 1e-4 * d) for d in range(1, 40)]
    with pytest.raises(ValueError, match="never vary prefill_tokens, prefill_seqs"):
        fit_cost_model(samples, source="x")


def test_fit_refuses_terms_in_lockstep() -> None:
    # Every prefill is 512 tokens long: tokens and sequences cannot be told apart.
    samples = [
        (
            StepShape(512 * s, s, d, 100 * d + c, s * prefill_pairs(512, 0)),
            0.01 + 1e-5 * 512 * s + 1e-4 * d,
        )
        for s, d, c in itertools.product(range(4), range(1, 6), (0, 5))
    ]
    with pytest.raises(ValueError, match="lockstep"):
        fit_cost_model(samples, source="x")


def test_fit_refuses_non_positive_times() -> None:
    samples = _samples(30)
    samples[3] = (samples[3][0], 0.0)
    with pytest.raises(ValueError, match="finite and > 0"):
        fit_cost_model(samples, source="x")


def test_nnls_matches_brute_force_over_active_sets() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        a = rng.normal(size=(12, 4))
        b = rng.normal(size=12)
        best = min(
            (_restricted_lstsq(a, b, subset) for subset in _subsets(4)),
            key=lambda x: float(np.linalg.norm(a @ x - b)),
        )
        got = nnls(a, b)
        assert (got >= 0).all()
        assert np.linalg.norm(a @ got - b) == pytest.approx(np.linalg.norm(a @ best - b))


def _subsets(n: int) -> list[tuple[int, ...]]:
    return [s for k in range(n + 1) for s in itertools.combinations(range(n), k)]


def _restricted_lstsq(a: np.ndarray, b: np.ndarray, subset: tuple[int, ...]) -> np.ndarray:
    """The least-squares solution on `subset`, or zeros when it is not feasible (>= 0)."""
    x = np.zeros(a.shape[1])
    if subset:
        x[list(subset)] = np.linalg.lstsq(a[:, list(subset)], b, rcond=None)[0]
    return x if (x >= 0).all() else np.zeros(a.shape[1])


# ---- profile files -------------------------------------------------------------------


def test_profile_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "replica.json"
    model = CostModel(4e-3, 2e-5, 1.5e-4, 3e-4, 4e-8, 2e-10, "calibrated: http://r:8000 2026-05-09")
    save_profile(model, path, meta={"samples": 400, "median_error_pct": 3.1})
    assert load_profile(path) == model
    document = json.loads(path.read_text())
    assert document["schema"] == "servepilot.costmodel/v1"
    assert document["meta"] == {"samples": 400, "median_error_pct": 3.1}
    assert not list(tmp_path.glob("*.tmp"))


def _write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(document))
    return path


def _good() -> dict[str, Any]:
    return {
        "schema": "servepilot.costmodel/v1",
        "source": "calibrated: x",
        "coefficients": dict(
            zip(cm.COEFFICIENTS, (1e-3, 1e-5, 1e-4, 1e-4, 1e-8, 1e-10), strict=True)
        ),
        "meta": {},
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(schema="servepilot.costmodel/v2"), "schema: expected"),
        (lambda d: d.pop("source"), "source: expected a non-empty string"),
        (lambda d: d["coefficients"].pop("base_s"), "coefficients.base_s: expected a number"),
        (lambda d: d["coefficients"].update(base_s="1"), "coefficients.base_s: expected a number"),
        (lambda d: d["coefficients"].update(base_s=True), "coefficients.base_s: expected a number"),
        (lambda d: d["coefficients"].update(per_decode_seq_s=-1.0), "per_decode_seq_s: must be"),
        (lambda d: d["coefficients"].update(per_token_s=1.0), "coefficients.per_token_s: unknown"),
        (lambda d: d.update(coefficients=[1, 2]), "coefficients: expected an object"),
        (lambda d: d.update(extra=1), "extra: unknown field"),
        (lambda d: d.update(meta=[]), "meta: expected an object"),
    ],
)
def test_bad_profile_names_file_and_field(
    tmp_path: Path, change: Callable[[dict[str, Any]], object], message: str
) -> None:
    document = _good()
    change(document)
    path = _write(tmp_path, document)
    with pytest.raises(ConfigError, match=message) as caught:
        load_profile(path)
    assert str(path) in str(caught.value)


def test_profile_that_is_not_json_or_missing(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"schema": ')
    with pytest.raises(ConfigError, match=r"broken\.json: not valid JSON \(line 1"):
        load_profile(path)
    with pytest.raises(ConfigError, match=r"missing\.json: no such cost profile"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="expected a JSON object"):
        load_profile(_write(tmp_path, [1, 2]))
    assert load_profile(_write(tmp_path, _good())).base_s == 1e-3
