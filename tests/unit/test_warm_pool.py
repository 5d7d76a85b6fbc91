"""The warm pool's pure parts: the configuration rules, the flags and environment of sleep
mode, which replicas `up` puts to sleep, and how status and top show them."""

from __future__ import annotations

from typing import Any

import pytest

from servepilot.core.config import (
    Device,
    EngineConfig,
    check_warm_pool,
    parse_config,
    pool_parks,
)
from servepilot.core.errors import ConfigError
from servepilot.engine.args import ServerSpec, launch_command, server_args, vllm_command
from servepilot.engine.simserver.args import sim_launch_command, sim_model
from servepilot.engine.simserver.config import parse_args
from servepilot.engine.simserver.sleep import SleepTimes, sleep_times
from servepilot.fleet import control
from servepilot.fleet.warm_pool import asleep_line, replicas_to_sleep
from servepilot.gateway.replica import ReplicaInfo, SleepState
from servepilot.gateway.warm import Transition

SPEC = ServerSpec(model_path="/models/m", served_name="m", host="127.0.0.1", port=8123)
GPU_SIM = {"hardware": {"device": "gpu", "accelerator": "h200"}}


def _problem(doc: dict[str, Any]) -> str | None:
    try:
        check_warm_pool(parse_config(doc, origin="fleet.yaml"))
    except ConfigError as exc:
        return exc.message
    return None


def test_the_configuration_rules_name_the_fields() -> None:
    gpu = {"device": "gpu", "accelerator": "h200"}
    ok = {"hardware": gpu, "engine": {"sleep_mode": True}, "replicas": {"count": 3, "asleep": 2}}
    assert _problem(ok) is None
    assert _problem({"engine": {"kind": "sim", "sleep_mode": True},
                     "replicas": {"count": 2, "asleep": 1}}) is None  # fmt: skip
    assert _problem({"hardware": gpu, "engine": {"sleep_mode": True},
                     "replicas": {"count": 2, "asleep": 2}}) == (
        "replicas.asleep (2) must be below replicas.count (2): at least one replica serves"
    )  # fmt: skip
    assert _problem({"hardware": gpu, "replicas": {"count": 2, "asleep": 1}}) == (
        "replicas.asleep > 0 needs engine.sleep_mode: true (vLLM's --enable-sleep-mode); "
        "only on hardware.device: cpu are replicas parked without it"
    )
    cpu = _problem({"engine": {"sleep_mode": True}})
    assert cpu is not None and cpu.startswith("engine.sleep_mode needs hardware.device: gpu")
    # A warm pool under the autoscaler (its pool target), asleep on a GPU, parked on CPU.
    scaled = {**ok, "autoscale": {"enabled": True}}
    assert _problem(scaled) is None
    assert not pool_parks(parse_config(scaled, origin="fleet.yaml"))
    parked = parse_config({"replicas": {"count": 2, "asleep": 1}}, origin="fleet.yaml")
    assert _problem({"replicas": {"count": 2, "asleep": 1}}) is None and pool_parks(parked)
    # On Ray too: the gateway sleeps, wakes or parks a replica through its own URL.
    assert _problem({"replicas": {"count": 2, "asleep": 1}, "cluster": {"backend": "ray"}}) is None
    with pytest.raises(ConfigError, match=r"replicas\.asleep"):
        parse_config({"replicas": {"asleep": -1}}, origin="fleet.yaml")


def test_sleep_mode_is_a_flag_and_the_dev_mode_variable() -> None:
    engine = EngineConfig(sleep_mode=True)
    assert "--enable-sleep-mode" in server_args(engine, SPEC, Device.GPU)
    assert "--enable-sleep-mode" not in server_args(EngineConfig(), SPEC, Device.GPU)
    command = launch_command(engine, SPEC, Device.GPU)
    assert command.env == {"VLLM_SERVER_DEV_MODE": "1"}
    assert launch_command(EngineConfig(), SPEC, Device.GPU).env == {}
    config = parse_config({**GPU_SIM, "engine": {"sleep_mode": True}}, origin="x")
    printed = vllm_command(config, "meta-llama/Llama-3.1-8B-Instruct", "llama")
    assert printed.startswith("VLLM_SERVER_DEV_MODE=1 vllm serve ")
    assert printed.endswith("--enable-sleep-mode")


def test_the_same_fleet_yaml_gives_the_simulated_replica_its_sleep_routes() -> None:
    config = parse_config({"engine": {"kind": "sim", "sleep_mode": True}}, origin="x")
    command = sim_launch_command(config, sim_model(config.model), "127.0.0.1", 8001)
    args, _ = parse_args(list(command.argv[3:]))
    assert sleep_times(args) == SleepTimes(first_sleep_s=11.6, sleep_s=0.4, wake_s=0.8)
    plain, _ = parse_args(["--model", "smollm2"])
    assert sleep_times(plain) is None


def test_up_puts_the_last_replicas_to_sleep() -> None:
    assert replicas_to_sleep(["r0", "r1", "r2"], 2) == ("r1", "r2")
    assert replicas_to_sleep(["r0", "r1"], 0) == ()
    done = Transition("r1", SleepState.ASLEEP, 11.62)
    assert asleep_line(done) == (
        "replica r1 asleep in 11.6 s (warm pool: `servepilot wake r1` puts it in rotation)"
    )
    assert done.to_json() == {"id": "r1", "sleep": "asleep", "took_s": 11.62, "drained": True}


def _info(sleep: SleepState, healthy: bool = True) -> ReplicaInfo:
    return ReplicaInfo("r1", "http://h:1", healthy, False, 0, 0, 0, 0, 0.0, ("m",), 8, None,
                       sleep=sleep)  # fmt: skip


def test_only_an_awake_healthy_replica_serves_and_status_says_asleep() -> None:
    assert _info(SleepState.AWAKE).serving
    assert not _info(SleepState.AWAKE, healthy=False).serving
    for state in (SleepState.ASLEEP, SleepState.WAKING, SleepState.FALLING_ASLEEP):
        assert not _info(state).serving
    row = _info(SleepState.ASLEEP).to_json()
    assert row["sleep"] == "asleep"
    assert control.replica_cells(row)[2] == "asleep"
    assert control.replica_cells(_info(SleepState.AWAKE).to_json())[2] == "yes"
    assert control.replica_cells({"id": "r0", "healthy": False})[2] == "NO"  # an older gateway


def test_status_counts_the_pool_apart_and_says_what_it_holds() -> None:
    assert asleep_line(Transition("r1", SleepState.PARKED, 0.0)) == (
        "replica r1 parked (warm pool: `servepilot wake r1` puts it in rotation)"
    )
    parked = _info(SleepState.PARKED).to_json()
    assert control.replica_cells(parked)[2] == "parked"
    rows = (_info(SleepState.AWAKE).to_json(), parked, _info(SleepState.ASLEEP).to_json(),
            _info(SleepState.AWAKE, healthy=False).to_json())  # fmt: skip
    assert control.pool_line(rows) == (
        "\nreplicas: 1 serving; warm pool: 1 asleep (weights in host memory, GPU memory freed; "
        "wakes in about a second); 1 parked (loaded and running, all its memory held; back in "
        "rotation at once)"
    )
    assert control.pool_line(rows[:1]) == ""
