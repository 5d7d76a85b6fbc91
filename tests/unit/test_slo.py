"""The one Slo type: fleet.yaml's section, the --slo parser, the result JSON's dict."""

from __future__ import annotations

import pytest
import yaml

from servepilot.core.config import parse_config
from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode, Run, Stats
from servepilot.core.slo import Metric, Slo, SloLimit, Statistic, parse_slo


def test_fleet_yaml_and_the_flag_give_the_same_slo() -> None:
    config = parse_config({"slo": {"ttft_p99_ms": 500, "e2e_p99_ms": 9000}}, origin="t")
    parsed = parse_slo("ttft_p99_ms=500,e2e_p99_ms=9000")
    assert config.slo == parsed
    assert config.slo.limits == (
        SloLimit(Metric.TTFT, Statistic.P99, 500.0),
        SloLimit(Metric.E2E, Statistic.P99, 9000.0),
    )


def test_limits_keep_the_order_given_and_the_per_request_ones_are_the_p99_latencies() -> None:
    slo = parse_slo("itl_p99_ms=50, tpot_p99_ms=20,ttft_p50_ms=300,ttft_p99_ms=800")
    assert slo.describe() == "itl_p99_ms=50, tpot_p99_ms=20, ttft_p50_ms=300, ttft_p99_ms=800"
    per_request = [slo.per_request_ms(m) for m in (Metric.TTFT, Metric.TPOT, Metric.E2E)]
    assert per_request == [800.0, 20.0, None]
    assert slo.per_request_ms(Metric.ITL) is None
    assert [lim.key for lim in slo.level_limits] == ["itl_p99_ms", "ttft_p50_ms"]
    # The result JSON's `slo` and fleet.yaml's: every limit, in the order given.
    assert list(slo.as_dict().items()) == [
        ("itl_p99_ms", 50.0),
        ("tpot_p99_ms", 20.0),
        ("ttft_p50_ms", 300.0),
        ("ttft_p99_ms", 800.0),
    ]
    assert slo.model_dump() == slo.as_dict()


def test_no_limit_is_an_empty_slo() -> None:
    assert Slo().limits == ()
    assert Slo().as_dict() == {}
    assert parse_config({}, origin="t").slo == Slo()


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_a_limit_is_a_finite_positive_number(value: str) -> None:
    with pytest.raises(ConfigError, match=r"--slo .*must be a positive number of ms"):
        parse_slo(f"ttft_p99_ms={value}")


def test_the_flag_is_named() -> None:
    with pytest.raises(ConfigError, match=r"^--slo-x 'x=1'"):
        parse_slo("x=1", "--slo-x")


def test_parses_every_metric_and_statistic_bench_reports() -> None:
    sla = parse_slo("ttft_p99_ms=500, tpot_p90_ms=50,e2e_mean_ms=9000,itl_p50_ms=40")
    got = {(limit.metric, limit.statistic, limit.limit_ms) for limit in sla.limits}
    assert got == {
        (Metric.TTFT, Statistic.P99, 500.0),
        (Metric.TPOT, Statistic.P90, 50.0),
        (Metric.E2E, Statistic.MEAN, 9000.0),
        (Metric.ITL, Statistic.P50, 40.0),
    }
    # Bench counts goodput per request against its TTFT/TPOT/E2E p99 keys only.
    assert [lim.key for lim in sla.limits if lim.per_request] == ["ttft_p99_ms"]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("ttft_p95_ms=500", ["ttft_p95_ms", "not p95", "ttft_p90_ms"]),
        ("ttft_p99=500", ["'ttft_p99=500'", "KEY=MS"]),
        ("latency_p99_ms=5", ["latency_p99_ms", "KEY=MS"]),
        ("tpot_p99_ms=fast", ["tpot_p99_ms", "'fast' is not a number"]),
        ("e2e_p99_ms=-3", ["e2e_p99_ms must be a positive"]),
        ("ttft_p99_ms", ["KEY=MS"]),
        (",", ["no limit"]),
    ],
)
def test_bad_slo_names_the_part(text: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_slo(text)
    shown = str(err.value)
    assert "--slo" in shown
    for word in words:
        assert word in shown


def test_fleet_yaml_slo_takes_every_key_the_flag_takes_in_its_order() -> None:
    text = "ttft_p99_ms=4000,itl_p99_ms=250,ttft_p50_ms=800,e2e_mean_ms=9000"
    slo = parse_slo(text)
    dumped = yaml.safe_dump({"slo": slo.model_dump()}, sort_keys=False)
    assert dumped.startswith("slo:\n  ttft_p99_ms: 4000.0\n  itl_p99_ms: 250.0\n")
    config = parse_config(yaml.safe_load(dumped), origin="t")
    assert config.slo == slo
    assert (
        config.slo.describe()
        == "ttft_p99_ms=4000, itl_p99_ms=250, ttft_p50_ms=800, e2e_mean_ms=9000"
    )


@pytest.mark.parametrize(
    ("slo", "words"),
    [
        ({"itl_p95_ms": 50}, ["slo: itl_p95_ms", "not p95", "itl_p90_ms"]),
        ({"latency_p99_ms": 5}, ["slo: latency_p99_ms: not a limit key", "ttft_p99_ms"]),
        ({"itl_p99_ms": "fast"}, ["slo: itl_p99_ms: 'fast' is not a number"]),
        ({"ttft_p50_ms": 0}, ["slo: ttft_p50_ms must be a positive number"]),
        ({"limits": []}, ["slo: limits: not a limit key"]),
        ([500], ["slo: expected a mapping of limits"]),
    ],
)
def test_bad_fleet_yaml_slo_names_the_key(slo: object, words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"slo": slo}, origin="fleet.yaml")
    shown = str(err.value)
    for word in words:
        assert word in shown


def _run(**stats: Stats) -> Run:
    none = Stats(mean=None, p50=None, p90=None, p99=None, count=0)
    return Run(
        load=Load(mode=LoadMode.CONCURRENCY, value=1),
        duration_s=1.0,
        completed=1,
        failed=0,
        request_throughput=1.0,
        output_throughput=1.0,
        total_token_throughput=1.0,
        ttft_ms=stats.get("ttft", none),
        tpot_ms=stats.get("tpot", none),
        itl_ms=stats.get("itl", none),
        e2e_ms=stats.get("e2e", none),
        goodput_rps=1.0,
        slo_attainment=1.0,
    )


def test_level_verdict_checks_only_the_level_limits() -> None:
    itl = Stats(mean=30.0, p50=20.0, p90=60.0, p99=120.0, count=10)
    ttft = Stats(mean=400.0, p50=300.0, p90=700.0, p99=900.0, count=10)
    run = _run(itl=itl, ttft=ttft)
    judged = parse_slo("ttft_p99_ms=500,itl_p99_ms=100,ttft_p50_ms=350").with_verdict(run)
    # ttft_p99_ms is per request (goodput's), so its 900 > 500 is not the level verdict's.
    assert (judged.slo_met, judged.slo_violated) == (False, ("itl_p99_ms",))
    met = parse_slo("itl_p99_ms=120,ttft_mean_ms=400,tpot_p50_ms=1").with_verdict(run)
    assert (met.slo_met, met.slo_violated) == (True, ())  # TPOT unmeasured: left out
    assert parse_slo("ttft_p99_ms=500").with_verdict(run) == run  # no level limit: no verdict
    assert run.slo_met is None


def test_an_empty_or_null_limit_sets_none() -> None:
    # What `servepilot config` printed before every key was allowed: each p99 key, null.
    old = yaml.safe_load("slo:\n  ttft_p99_ms: null\n  tpot_p99_ms: 50\n  e2e_p99_ms: null\n")
    assert parse_config(old, origin="t").slo == parse_slo("tpot_p99_ms=50")
    assert parse_config({"slo": None}, origin="t").slo == Slo()
