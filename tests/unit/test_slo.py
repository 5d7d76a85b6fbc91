"""The one Slo type: fleet.yaml's section, the --slo parser, the result JSON's dict."""

from __future__ import annotations

import pytest

from servepilot.core.config import parse_config
from servepilot.core.errors import ConfigError
from servepilot.core.slo import Metric, Slo, SloLimit, Statistic, parse_slo


def test_fleet_yaml_and_the_flag_give_the_same_slo() -> None:
    config = parse_config({"slo": {"ttft_p99_ms": 500, "e2e_p99_ms": 9000}}, origin="t")
    parsed = parse_slo("ttft_p99_ms=500,e2e_p99_ms=9000")
    assert config.slo == parsed
    assert config.slo.limits == (
        SloLimit(Metric.TTFT, Statistic.P99, 500.0),
        SloLimit(Metric.E2E, Statistic.P99, 9000.0),
    )


def test_limits_keep_the_order_given_and_the_fields_the_per_request_ones() -> None:
    slo = parse_slo("itl_p99_ms=50, tpot_p99_ms=20,ttft_p50_ms=300,ttft_p99_ms=800")
    assert slo.describe() == "itl_p99_ms=50, tpot_p99_ms=20, ttft_p50_ms=300, ttft_p99_ms=800"
    assert (slo.ttft_p99_ms, slo.tpot_p99_ms, slo.e2e_p99_ms) == (800.0, 20.0, None)
    # The result JSON's `slo`: the per-request limits, in the schema's order.
    assert list(slo.as_dict().items()) == [("ttft_p99_ms", 800.0), ("tpot_p99_ms", 20.0)]


def test_no_limit_is_an_empty_slo() -> None:
    assert Slo().limits == ()
    assert Slo().as_dict() == {}
    assert parse_config({}, origin="t").slo == Slo()


@pytest.mark.parametrize("text", ["itl_p99_ms=50", "ttft_p50_ms=5", "ttft=5", "ttft_p99_ms"])
def test_per_request_slo_takes_only_the_per_request_keys(text: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_slo(text, per_request=True)
    shown = str(err.value)
    assert "--slo" in shown
    assert "ttft_p99_ms, tpot_p99_ms, e2e_p99_ms" in shown


@pytest.mark.parametrize("value", ["inf", "nan", "0", "-1"])
def test_a_limit_is_a_finite_positive_number(value: str) -> None:
    for per_request in (False, True):
        with pytest.raises(ConfigError, match=r"--slo .*must be a positive number of ms"):
            parse_slo(f"ttft_p99_ms={value}", per_request=per_request)


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
    # Bench counts goodput per request against its p99 keys only.
    assert (sla.ttft_p99_ms, sla.tpot_p99_ms, sla.e2e_p99_ms) == (500.0, None, None)


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
