"""The prefill scale read from full prefill steps: known answers, and the recorded loans."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import benchmarks.gpu_prefill_fit as prefill_fit
from benchmarks.gpu_prefill_fit import prefill_scale

RUNS_DIR = Path(__file__).resolve().parent.parent / "gpu_runs"


def test_the_scale_is_the_steps_prefill_time_together_over_the_composed() -> None:
    """Three steps of 100, 60 and 140 ms whose operators compose 80 ms with 10 of decoders:
    (300 - 30) / (240 - 30)."""
    steps = [(0.100, 0.080, 0.010), (0.060, 0.080, 0.010), (0.140, 0.080, 0.010)]
    assert prefill_scale(steps, eager_s=0.050) == pytest.approx(270 / 210)


def test_too_few_steps_or_host_bound_steps_fit_nothing() -> None:
    step = (0.070, 0.050, 0.005)
    assert prefill_scale([step, step], eager_s=0.0) is None
    # 70 ms a step on average, no longer than a 67 ms eager launch (x1.05): the host's.
    assert prefill_scale([step] * 3, eager_s=0.067) is None
    assert prefill_scale([step] * 3, eager_s=0.060) == pytest.approx(65 / 45)
    assert prefill_scale([(0.040, 0.050, 0.005)] * 3, eager_s=0.0) == 1.0  # faster: 1


def test_the_recorded_calibration_bursts(monkeypatch: pytest.MonkeyPatch) -> None:
    """On the loans' calibration cases: DeepSeek-V2-Lite's full steps took about 1.3 times
    what its operators compose, Qwen2.5-32B's what they compose; Llama-3.1-8B FP8 (one full
    group a burst at 16 in flight) and bf16 (no token arrivals) are not fitted."""
    written: list[tuple[Any, ...]] = []
    monkeypatch.setattr(prefill_fit, "write_meta", lambda *args, **kw: written.append(args))
    names = ("padded", "qwen", "tokens")
    folders = [
        RUNS_DIR / f"2026-12-0{6 if n == 'padded' else 7}-sim-validate-h100-{n}" for n in names
    ]
    fits = prefill_fit.fit_prefill_scales(folders)
    assert set(fits) == {("deepseek-v2-lite", "bf16"), ("qwen2.5-32b", "bf16")}
    assert 1.2 < fits[("deepseek-v2-lite", "bf16")]["prefill_scale"] < 1.4
    assert fits[("qwen2.5-32b", "bf16")]["prefill_scale"] == 1.0  # 0.99 read
    assert "closed-mid@64" in fits[("deepseek-v2-lite", "bf16")]["prefill_scale_fitted_on"]
    assert len(written) == 2 * len(folders)
