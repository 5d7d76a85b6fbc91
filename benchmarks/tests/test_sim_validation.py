"""benchmarks/sim_validation.py and sim_cases.py: the out-of-sample cases and their arithmetic
(no replica: the cases, their disjointness from calibrate's probes, errors and spreads)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_sim import ENGINE
from benchmarks.sim_cases import (
    KINDS,
    TEMPLATE_TOKENS,
    Shape,
    draw_cases,
    estimated_s,
    overlaps,
    probe_shapes,
)
from benchmarks.sim_validation import Store, _set_profile_aside, case_errors, summarize


@pytest.fixture(scope="module")
def cases() -> list[Shape]:
    return draw_cases(32, 22)


def test_the_draw_is_seeded_and_spans_what_the_issue_asks(cases: list[Shape]) -> None:
    assert [c.name for c in draw_cases(32, 22)] == [c.name for c in cases]
    assert [c.name for c in draw_cases(32, 23)] != [c.name for c in cases]
    assert len({c.name for c in cases}) == 32
    assert {c.kind for c in cases} == set(KINDS)
    closed = [c.concurrency for c in cases if c.concurrency]
    for low, high in ((1, 2), (3, 6), (7, 16), (17, 32), (33, 64)):
        assert any(low <= n <= high for n in closed), (low, high)
    assert any(c.rate_rps for c in cases)
    prompts = [n for c in cases for n in (c.input_tokens, c.long_input_tokens) if n]
    assert min(prompts) >= 16 and max(prompts) <= 2048
    assert max(prompts) > 1024  # longer than any probe
    assert all(8 <= c.output_tokens <= 512 for c in cases)
    assert max(c.output_tokens for c in cases) > 200
    assert any(c.prefix_tokens for c in cases) and any(c.long_input_tokens for c in cases)


def test_every_case_fits_the_replica_and_the_time_budget(cases: list[Shape]) -> None:
    for c in cases:
        longest = (c.long_input_tokens or c.input_tokens) + TEMPLATE_TOKENS + c.output_tokens
        assert longest <= ENGINE["max_model_len"], c.name
        assert 8 <= c.requests <= 64 and c.requests >= (c.concurrency or 0), c.name
        # bench refuses a prompt its chat template fills (--input-tokens counts the template).
        assert c.input_tokens >= TEMPLATE_TOKENS + 3, c.name
        assert not c.prefix_tokens or c.prefix_tokens <= c.input_tokens - TEMPLATE_TOKENS - 8
        assert estimated_s(c) <= 30, c.name
    assert 15 * 60 < 2 * sum(estimated_s(c) for c in cases) < 40 * 60


def test_no_case_looks_like_a_calibration_probe(cases: list[Shape]) -> None:
    prompts, outputs, pairs = probe_shapes()
    # calibrate's full plan on this replica: its lone prefills and its waves' shapes.
    assert {16, 1024, 32, 512} <= prompts and {48, 40, 32} <= outputs and (16, 256) in pairs
    assert all(overlaps(c) == [] for c in cases)
    probe_like = Shape("closed", 16, None, 256, 40, 16)
    assert overlaps(probe_like) == ["prompt 256", "answer 40", "wave of 16 x 256"]


def test_flags_say_the_same_case_to_bench_and_sim() -> None:
    shape = Shape("prefix-open", None, 2.5, 300, 20, 30, prefix_tokens=200, prefixes=2)
    assert shape.name == "prefix-open-r2.5-in300-pre200x2-out20"
    assert " ".join(shape.flags()) == (
        "--input-tokens 300 --output-tokens 20 --requests 30 --rate 2.5 "
        "--workload shared_prefix --prefix-tokens 200 --num-prefixes 2"
    )


def _entry(runs: list[float], predicted: float | None) -> dict[str, object]:
    def metrics(v: float) -> dict[str, float]:
        return {"ttft_p50_ms": v, "tpot_p50_ms": v / 10, "output_tok_s": 1000 / v}

    return {"measured": [metrics(v) for v in runs],
            "predicted": metrics(predicted) if predicted else None}  # fmt: skip


def test_error_is_against_the_mean_of_two_runs_and_spread_is_their_gap() -> None:
    errors, spread = case_errors(_entry([100.0, 110.0], 115.0))
    assert errors["ttft_p50_ms"] == pytest.approx(100 * 10 / 105)
    assert spread["ttft_p50_ms"] == pytest.approx(100 * 10 / 105)
    assert errors["tpot_p50_ms"] == pytest.approx(100 * 1.0 / 10.5)
    errors, _ = case_errors(_entry([100.0, 110.0], 94.5))
    assert errors["ttft_p50_ms"] == pytest.approx(-10.0)  # signed; the summary takes |e|
    errors, spread = case_errors(_entry([100.0], None))
    assert errors == {} and spread == {}


def test_summary_takes_median_p90_and_the_spread_target(tmp_path: Path) -> None:
    store = Store(tmp_path / "validation.json")
    shapes = [Shape("closed", 1, None, 20 + i, 9, 8) for i in range(5)]
    # TTFT errors 0, 2, 4, 6, 8% (the runs 100 and 100: no spread) ...
    for i, shape in enumerate(shapes):
        store.data["cases"][shape.name] = _entry([100.0, 100.0], 100.0 + 2 * i)
    row = summarize(shapes, store)["ttft_p50_ms"]
    assert row["median_abs_pct"] == pytest.approx(4.0)
    assert row["p90_abs_pct"] == pytest.approx(7.2)
    # ... within 7% / 20%, but the measurement repeats itself exactly: 1.5 x 0 fails.
    assert row["spread_median_pct"] == 0.0 and row["meets_targets"] is False
    for shape in shapes:
        store.data["cases"][shape.name]["measured"][1]["ttft_p50_ms"] = 110.0
    assert summarize(shapes, store)["ttft_p50_ms"]["meets_targets"] is True
    store.data["cases"][shapes[0].name]["predicted"]["ttft_p50_ms"] = 90.0  # -14.3%
    # |errors| 14.3, 2.9, 1.0, 1.0, 2.9 %: p90 interpolates between 2.9 and 14.3.
    p90 = summarize(shapes, store)["ttft_p50_ms"]["p90_abs_pct"]
    assert p90 == pytest.approx(100 * (3 + 0.6 * 12) / 105)
    store.save()
    assert json.loads(store.path.read_text())["cases"].keys() == {s.name for s in shapes}


def test_a_target_below_the_measurements_own_noise_is_not_checkable(tmp_path: Path) -> None:
    shapes = draw_cases(4, 22)
    store = Store(tmp_path / "validation.json")
    # Runs of 80 and 120 (spread 40% of their mean): were the truth 120 (the first run the
    # noisy one), a perfect model would be off their mean by 20%, half the spread.
    for shape in shapes:
        store.data["cases"][shape.name] = _entry([80.0, 120.0], 120.0)
    row = summarize(shapes, store)["ttft_p50_ms"]
    assert row["spread_median_pct"] == pytest.approx(40.0)
    assert row["floor_median_pct"] == pytest.approx(20.0)
    assert row["meets_targets"] is False and row["missed"] is False  # not checkable
    # Runs of 98 and 102: a floor of 2%, below 7% / 20%: the targets can be checked.
    for shape in shapes:
        store.data["cases"][shape.name] = _entry([98.0, 102.0], 100.0)
    row = summarize(shapes, store)["ttft_p50_ms"]
    assert row["floor_median_pct"] == pytest.approx(2.0) and row["meets_targets"] is True
    # The same runs and a model 10% off: above a target the noise does not hide, missed.
    for shape in shapes:
        store.data["cases"][shape.name]["predicted"]["ttft_p50_ms"] = 110.0
    row = summarize(shapes, store)["ttft_p50_ms"]
    assert row["meets_targets"] is False and row["missed"] is True
    # Judged on the floor this machine has (issue 34): 10% against a floor of 2% is 5 times it.
    assert row["floor_ratio"] == pytest.approx(5.0) and row["meets_floor_target"] is False


def test_the_floor_target_is_a_quarter_above_the_floor(tmp_path: Path) -> None:
    shapes = draw_cases(4, 22)
    store = Store(tmp_path / "validation.json")
    # Runs of 90 and 110: a floor of 10%. A model 12% off the mean is 1.2 times it (met),
    # 13% off is 1.3 times (missed), though both miss the absolute 7% target.
    for predicted, met in ((112.0, True), (113.0, False)):
        for shape in shapes:
            store.data["cases"][shape.name] = _entry([90.0, 110.0], predicted)
        row = summarize(shapes, store)["ttft_p50_ms"]
        assert row["floor_median_pct"] == pytest.approx(10.0)
        assert row["meets_floor_target"] is met and row["meets_targets"] is False
    # Runs that repeat exactly have no floor to be judged against: never met.
    for shape in shapes:
        store.data["cases"][shape.name] = _entry([100.0, 100.0], 100.0)
    assert summarize(shapes, store)["ttft_p50_ms"]["meets_floor_target"] is False


def test_recalibrating_keeps_every_earlier_profile(tmp_path: Path) -> None:
    (tmp_path / "profile.json").write_text("third")
    (tmp_path / "profile-replaced-1.json").write_text("first")
    (tmp_path / "profile-replaced-2.json").write_text("second")
    _set_profile_aside(tmp_path)
    assert not (tmp_path / "profile.json").exists()  # so the next run calibrates again
    kept = {p.name: p.read_text() for p in tmp_path.glob("profile-replaced-*.json")}
    assert kept == {
        "profile-replaced-1.json": "first",
        "profile-replaced-2.json": "second",
        "profile-replaced-3.json": "third",
    }
    _set_profile_aside(tmp_path)  # none to move: nothing changes
    assert len(list(tmp_path.glob("profile*.json"))) == 3
