"""The sweep's stopping rule and the sweet spot on curves with known shapes."""

from servepilot.core.results import Load, LoadMode, Run, Stats
from servepilot.load.sweep import SweepConfig, next_step, sweet_spot


def run(level: float, tok_s: float, p99_ms: float, *, failed: int = 0, goodput: float = 0.0,
        attainment: float = 1.0, reached: bool = True) -> Run:  # fmt: skip
    s = Stats(mean=p99_ms / 2, p50=p99_ms / 2, p90=p99_ms * 0.9, p99=p99_ms, count=100)
    return Run(
        load=Load(mode=LoadMode.CONCURRENCY, value=level), duration_s=10.0,
        completed=100 - failed, failed=failed, request_throughput=tok_s / 100,
        output_throughput=tok_s, total_token_throughput=tok_s * 2, ttft_ms=s, tpot_ms=s,
        itl_ms=s, e2e_ms=s, goodput_rps=goodput, slo_attainment=attainment,
        load_reached=reached,
    )  # fmt: skip


# Throughput saturates at ~400 tok/s from concurrency 8; P99 doubles per level after it.
CURVE = [
    run(1, 60, 200), run(2, 118, 210), run(4, 230, 230), run(8, 380, 300),
    run(16, 395, 600), run(32, 400, 1200), run(64, 401, 2400),
]  # fmt: skip


def test_sweep_doubles_from_the_start() -> None:
    config = SweepConfig()
    assert next_step(config, []).load == Load(mode=LoadMode.CONCURRENCY, value=1)
    assert next_step(config, CURVE[:3]).load == Load(mode=LoadMode.CONCURRENCY, value=8)


def test_sweep_stops_once_throughput_is_flat_and_p99_climbs() -> None:
    config = SweepConfig()
    # After 16 one flat level only: go on.
    assert next_step(config, CURVE[:5]).load is not None
    # After 32: two flat levels (395, 400 vs 380 * 1.05) while P99 climbed 300 -> 1200.
    step = next_step(config, CURVE[:6])
    assert step.load is None
    assert "stopped rising" in step.reason


def test_sweep_does_not_stop_on_flat_throughput_with_flat_latency() -> None:
    flat = [run(1, 100, 200), run(2, 101, 200), run(4, 102, 200), run(8, 102, 200)]
    assert next_step(SweepConfig(), flat).load is not None


def test_sweep_stops_when_requests_fail() -> None:
    step = next_step(SweepConfig(), [run(1, 100, 200), run(2, 120, 300, failed=20)])
    assert step.load is None and "20% of 100 requests failed" in step.reason


def test_sweep_respects_its_limits() -> None:
    assert next_step(SweepConfig(max_value=4), CURVE[:3]).load is None
    assert next_step(SweepConfig(max_levels=3), CURVE[:3]).load is None


def test_sweet_spot_is_the_knee() -> None:
    spot = sweet_spot(CURVE, slo_set=False)
    assert spot is not None
    # 380 tok/s is 95% of the 401 peak, first level above 90%.
    assert spot.load.value == 8
    assert "95% of its peak" in spot.reason
    assert "+6% throughput" in spot.reason and "+700% P99" in spot.reason


def test_sweet_spot_at_the_top_says_to_go_higher() -> None:
    rising = [run(1, 100, 200), run(2, 200, 210), run(4, 400, 220)]
    spot = sweet_spot(rising, slo_set=False)
    assert spot is not None and spot.load.value == 4
    assert "try higher" in spot.reason


def test_sweet_spot_with_an_slo_is_the_best_goodput() -> None:
    runs = [run(1, 100, 200, goodput=1.0), run(2, 200, 300, goodput=1.9, attainment=0.95),
            run(4, 300, 900, goodput=0.5, attainment=0.2)]  # fmt: skip
    spot = sweet_spot(runs, slo_set=True)
    assert spot is not None and spot.load.value == 2
    assert "1.90 req/s meet every SLO (95%" in spot.reason


def test_sweet_spot_skips_levels_that_missed_a_level_limit() -> None:
    missed = {"slo_met": False, "slo_violated": ("itl_p99_ms",)}
    runs = [run(1, 100, 200, goodput=1.0).model_copy(update={"slo_met": True}),
            run(2, 200, 300, goodput=1.9).model_copy(update=missed),
            run(4, 300, 900, goodput=1.5).model_copy(update={"slo_met": True})]  # fmt: skip
    spot = sweet_spot(runs, slo_set=True)
    assert spot is not None and spot.load.value == 4
    assert "1.50 req/s meet every SLO" in spot.reason
    assert sweet_spot([r.model_copy(update=missed) for r in runs], slo_set=True) is None


def test_no_sweet_spot_without_completed_requests() -> None:
    assert sweet_spot([run(1, 0, 0, failed=100)], slo_set=False) is None


def test_a_level_that_never_reached_its_load_is_never_the_sweet_spot() -> None:
    # --requests 12: c=16/32/64 ran with at most 12 in flight. Their throughput (measured at
    # 12 in flight) must not make c=16 the sweet spot.
    runs = [run(1, 60, 200), run(2, 118, 210), run(4, 230, 230), run(8, 300, 300),
            run(16, 390, 600, reached=False), run(32, 390, 600, reached=False)]  # fmt: skip
    spot = sweet_spot(runs, slo_set=False)
    assert spot is not None and spot.load.value == 8
    assert spot.reason == (
        "throughput is 100% of its peak (300.0 tok/s) at concurrency 8, the highest load that "
        "ran at its level (higher ones never reached theirs): throughput may still rise, try "
        "higher with more requests"
    )
    goodput = [run(4, 230, 230, goodput=2.0), run(16, 390, 600, goodput=3.0, reached=False)]
    spot = sweet_spot(goodput, slo_set=True)
    assert spot is not None and spot.load.value == 4
    assert sweet_spot([run(16, 390, 600, reached=False)], slo_set=False) is None


def test_sweep_stops_after_a_level_that_never_reached_its_load() -> None:
    # --requests 12 --sweep: c=16 had at most 12 in flight; c=32 would have no more.
    step = next_step(SweepConfig(), [run(8, 300, 300), run(16, 390, 600, reached=False)])
    assert step.load is None
    assert step.reason == "concurrency 16 never reached its load: a higher level would not add any"
