"""The typed flag records of load, sim and bench: what the CLI's flags parse into, and the
refusals that name the flag typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from servepilot.bench.flags import BenchFlags
from servepilot.core.config import parse_config
from servepilot.core.errors import ConfigError
from servepilot.core.results import Load, LoadMode
from servepilot.core.slo import Slo
from servepilot.core.urls import base_url
from servepilot.load.flags import LoadFlags, WorkloadFlags
from servepilot.load.levels import LevelOptions
from servepilot.load.sweep import SweepConfig
from servepilot.load.workload import WorkloadKind
from servepilot.sim.fleet.flags import SimFlags

LOAD = LoadFlags(concurrency=None, rate=None, sweep=False, requests=None, duration=None,
                 warmup=0, arrival="poisson", burstiness=1.0)  # fmt: skip
WORKLOAD = WorkloadFlags(
    workload="mixed", input_tokens=256, output_tokens=128, seed=3, long_fraction=0.2,
    long_input_tokens=None, num_prefixes=8, prefix_tokens=None, turns=4, active_sessions=16,
    trace=None, priority_mix="0=3,2=1", sessions=None,
)  # fmt: skip


def _load(**given: object) -> LoadFlags:
    fields = {name: getattr(LOAD, name) for name in LoadFlags.__dataclass_fields__}
    return LoadFlags(**(fields | given))


def test_levels_default_to_one_closed_loop_request_and_parse_lists() -> None:
    spec = WORKLOAD.spec()
    assert _load().loads(spec) == (Load(mode=LoadMode.CONCURRENCY, value=1),)
    rates = _load(rate="0.5,2").loads(spec)
    assert rates == tuple(Load(mode=LoadMode.RATE, value=v) for v in (0.5, 2))
    assert _load(sweep=True).loads(spec) == ()
    assert _load(sweep=True, rate="3").sweep_config() == SweepConfig(LoadMode.RATE, 3.0)
    levels = _load(concurrency="1,4", duration="90s").levels(WORKLOAD.spec())
    assert isinstance(levels, LevelOptions) and levels.duration_s == 90.0
    assert [load.value for load in levels.loads] == [1.0, 4.0]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"concurrency": "1.5"}, "--concurrency '1.5': levels must be whole numbers"),
        ({"sweep": True, "soak": "5m"}, "--sweep and --soak do not go together"),
        ({"rate": "0"}, "--rate '0': levels must be positive"),
        ({"duration": "soon"}, "--duration"),
    ],
)
def test_load_flags_refused_name_the_flag(given: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _load(**given).levels(WORKLOAD.spec())


def test_the_simulator_refuses_counts_a_real_client_would_run() -> None:
    _load(requests=0).levels(WORKLOAD.spec())  # bench runs it
    with pytest.raises(ConfigError, match="--requests must be at least 1, got 0"):
        _load(requests=0).check_counts()
    with pytest.raises(ConfigError, match="--warmup must be at least 0, got -1"):
        _load(warmup=-1).check_counts()


def test_workload_flags_parse_the_kind_and_the_priority_mix() -> None:
    spec = WORKLOAD.spec()
    assert spec.kind is WorkloadKind.MIXED and spec.seed == 3
    assert spec.priority_mix is not None and set(spec.priority_mix) == {0, 2}


def test_base_url_drops_v1_and_refuses_what_is_not_a_url() -> None:
    assert base_url("http://h:8000/v1/", "--url") == "http://h:8000"
    with pytest.raises(ConfigError, match="--replica 'h:8000': expected a URL"):
        base_url("h:8000", "--replica")


def _bench(**given: object) -> BenchFlags:
    fields: dict[str, object] = dict(url="http://h:1", model="m", endpoint="chat", api_key=None,
        tokenizer=None, metrics_url=None, timeout=600.0, soak=None, window=None,
        processes=None, seed=0, slo=None)  # fmt: skip
    return BenchFlags(**(fields | given))  # type: ignore[arg-type]


def test_bench_flags_need_a_url_and_one_level_to_soak() -> None:
    with pytest.raises(ConfigError, match="--url is required"):
        _bench(url=None)
    one = _load(concurrency="2").levels(WORKLOAD.spec())
    two = _load(concurrency="2,4").levels(WORKLOAD.spec())
    assert _bench(soak="30m").soak_s(one) == 1800.0
    assert _bench().soak_s(two) is None
    with pytest.raises(ConfigError, match="--soak runs one load level"):
        _bench(soak="30m").soak_s(two)


def test_a_soak_window_is_a_tenth_of_it_at_least_10_s_unless_given() -> None:
    assert _bench().window_s(1800.0) == 180.0
    assert _bench().window_s(60.0) == 10.0
    assert _bench().window_s(None) == 30.0
    assert _bench(window="1m").window_s(1800.0) == 60.0


def _sim(**given: object) -> SimFlags:
    fields: dict[str, object] = dict(profile=None, replicas_per_node=None, network_ms=None,
        scrape_interval=None, cold_start="78s", start_cold=False, autoscale=None,
        scaling_policy="target", autoscale_target=0.7, replica_rps=None,
        forecast_horizon=None, autoscale_interval="15s", slo=None, seed=0)  # fmt: skip
    return SimFlags(**(fields | given))  # type: ignore[arg-type]


def test_sim_flags_set_up_the_fleet_of_fleet_yaml(tmp_path: Path) -> None:
    config = parse_config({"replicas": {"count": 3}, "slo": {"ttft_p99_ms": 900}}, origin="t")
    levels = _load().levels(WORKLOAD.spec())
    setup, opts = _sim(cold_start="30s").options(config, levels, frozenset())
    assert opts.spec.replicas == 3 and opts.spec.cold_start_s == 30.0
    assert opts.slo == config.slo and opts.autoscaler is None and "autoscale" not in opts.target
    assert opts.prompt_overhead_tokens == setup.prompt_overhead_tokens
    _, given = _sim(slo="e2e_p99_ms=100", autoscale="1:4").options(config, levels, frozenset())
    assert given.slo != config.slo and isinstance(given.slo, Slo)
    assert given.autoscaler is not None and "autoscale" in given.target
    with pytest.raises(ConfigError, match="--replicas-per-node must be at least 1, got -1"):
        _sim(replicas_per_node=-1).options(config, levels, frozenset())


def test_sim_kv_events_follow_fleet_yaml_unless_the_flags_say() -> None:
    config = parse_config({"replicas": {"count": 2}}, origin="t")
    levels = _load().levels(WORKLOAD.spec())
    default = _sim().options(config, levels, frozenset())[1].spec
    assert default.kv_events is True and default.kv_events_delay_s is None  # engine.kv_events
    off = _sim(kv_events="off").options(config, levels, frozenset())[1].spec
    assert off.kv_events is False
    quiet = parse_config({"engine": {"kv_events": False}}, origin="t")
    given = _sim(kv_events="on", kv_events_delay_ms=20.0).options(quiet, levels, frozenset())
    assert given[1].spec.kv_events is True and given[1].spec.kv_events_delay_s == 0.02


def test_a_trace_without_a_load_flag_is_replayed_in_an_open_loop(tmp_path: Path) -> None:
    """A trace's timestamps are kept only in an open loop; with no --rate or --concurrency,
    bench used to run it as a closed loop of 1, one request after another (the GPU suite's
    300-request trace at 20/s took 5 minutes instead of 15 s)."""
    trace = tmp_path / "t.jsonl"
    stamps = (0.0, 0.5, 1.0, 4.0)  # 3 gaps over 4 s: 0.75 requests/s
    trace.write_text("".join(
        f'{{"timestamp": {t}, "input_tokens": 40, "output_tokens": 8}}\n' for t in stamps
    ))  # fmt: skip
    fields = {n: getattr(WORKLOAD, n) for n in WorkloadFlags.__dataclass_fields__}
    flags = WorkloadFlags(**(fields | {"workload": "trace", "trace": trace, "priority_mix": None}))
    spec = flags.spec()
    assert _load().loads(spec) == (Load(mode=LoadMode.RATE, value=0.75),)
    # An asked closed loop is still what runs.
    assert _load(concurrency="4").loads(spec) == (Load(mode=LoadMode.CONCURRENCY, value=4),)
