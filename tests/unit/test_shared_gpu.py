"""Several replicas on one GPU (hardware.replicas_per_gpu): each replica's memory share, the
GPUs they need and get (known answers on injected inventories), the order they start in, and
the refusals that name the field to change."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from servepilot.core.config import EngineKind, parse_config
from servepilot.core.errors import ConfigError, EngineStartError
from servepilot.engine.args import KvEventsPorts, LaunchCommand
from servepilot.engine.gpu.assign import assign_devices
from servepilot.engine.gpu.inventory import NO_GPU, GpuDevice, GpuInventory, GpuLink
from servepilot.engine.model_source import ResolvedModel
from servepilot.engine.process import ReplicaInfo
from servepilot.engine.simserver.args import sim_launch_command, sim_model
from servepilot.fleet.devices import check_planned_fleet, replica_devices
from servepilot.fleet.k8s.target import check as check_k8s
from servepilot.fleet.local import LocalReplicas
from servepilot.fleet.ray.placement import check_whole_gpus
from servepilot.fleet.start_order import start_steps, waves
from servepilot.plan.gpu_fit import GpuDemand

GIB = 2**30


def nvlinked(count: int) -> GpuInventory:
    devices = tuple(GpuDevice(i, "NVIDIA H200", 141 * GIB, 0, 0.0) for i in range(count))
    links = {pair: GpuLink.NVLINK for pair in itertools.combinations(range(count), 2)}
    return GpuInventory(devices=devices, links=links, source="fake")


def shared_fleet(replicas: int, per_gpu: int, count: int = 8, **engine: Any) -> dict[str, Any]:
    return {
        "hardware": {"device": "gpu", "accelerator": "h200-141", "count": count,
                     "replicas_per_gpu": per_gpu},
        "engine": engine,
        "replicas": {"count": replicas},
    }  # fmt: skip


# --- each replica's memory share ---------------------------------------------------------


def test_an_unset_memory_share_is_vllms_default_split_between_the_replicas() -> None:
    two = parse_config(shared_fleet(2, 2), origin="t")
    assert two.engine.gpu_memory_utilization == 0.45
    assert parse_config(shared_fleet(3, 3), origin="t").engine.gpu_memory_utilization == 0.3
    assert parse_config(shared_fleet(7, 7), origin="t").engine.gpu_memory_utilization == 0.128
    # Still a default: a copy with another share count derives it again.
    assert "gpu_memory_utilization" not in two.engine.model_fields_set
    four = two.with_overrides({"hardware.replicas_per_gpu": 4})
    assert four.engine.gpu_memory_utilization == 0.225
    assert parse_config({}, origin="t").engine.gpu_memory_utilization == 0.9


def test_shares_over_the_whole_gpu_are_refused_naming_both_fields() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(shared_fleet(2, 2, gpu_memory_utilization=0.9), origin="fleet.yaml")
    assert (
        "hardware.replicas_per_gpu: 2 replicas share each GPU at "
        "engine.gpu_memory_utilization 0.9 each: 180% of it; set "
        "engine.gpu_memory_utilization to 0.45 or less"
    ) in str(caught.value)
    given = parse_config(shared_fleet(2, 2, gpu_memory_utilization=0.5), origin="t")
    assert given.engine.gpu_memory_utilization == 0.5


def test_sharing_needs_a_gpu_and_accepts_simulated_replicas() -> None:
    with pytest.raises(ConfigError, match=r"replicas_per_gpu 2 needs hardware.device: gpu; on "
                       r"CPU set replicas.count and engine.cpu_threads instead"):  # fmt: skip
        parse_config({"hardware": {"replicas_per_gpu": 2}}, origin="t")
    sim = parse_config(shared_fleet(4, 2, kind="sim"), origin="t")
    assert (sim.engine.kind, sim.engine.gpu_memory_utilization) == (EngineKind.SIM, 0.45)


# --- the GPUs they need and get ----------------------------------------------------------


def test_three_replicas_two_per_gpu_take_two_gpus_neighbours_sharing() -> None:
    demand = GpuDemand(replicas=3, replicas_per_gpu=2)
    assert (demand.groups, demand.total) == (2, 2)
    result = assign_devices(nvlinked(2), demand)
    assert result.describe() == "r0: 0  r1: 0  r2: 1  (topology)"
    assert [result.group_of(n) for n in range(3)] == [0, 0, 1]


def test_tp2_replicas_share_whole_tp_groups() -> None:
    demand = GpuDemand(replicas=4, tensor_parallel_size=2, replicas_per_gpu=2)
    result = assign_devices(nvlinked(4), demand)
    assert [result.visible_devices(n) for n in range(4)] == ["0,1", "0,1", "2,3", "2,3"]


def test_three_replicas_two_per_gpu_on_one_gpu_are_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError) as caught:
        assign_devices(nvlinked(1), GpuDemand(replicas=3, replicas_per_gpu=2))
    assert caught.value.message == (
        "the fleet needs 2 GPUs (3 replicas / replicas_per_gpu 2, rounded up, = 2 x "
        "tensor_parallel_size 1 x pipeline_parallel_size 1) but this node has 1"
    )
    assert caught.value.hint is not None
    assert caught.value.hint.startswith("run at most 2 replicas")


def test_unreadable_gpus_fall_back_to_the_declared_count_shared_too() -> None:
    result = assign_devices(NO_GPU, GpuDemand(replicas=4, replicas_per_gpu=2), declared_count=2)
    assert [result.visible_devices(n) for n in range(4)] == ["0", "0", "1", "1"]


def test_the_fleet_slots_follow_the_share_and_plan_checks_the_declared_count() -> None:
    data = shared_fleet(2, 2, count=1)
    data["autoscale"] = {"enabled": True, "min_replicas": 1, "max_replicas": 4}
    with pytest.raises(ConfigError, match=r"needs 2 GPUs \(4 replicas / replicas_per_gpu 2"):
        check_planned_fleet(parse_config(data, origin="t"))
    data["hardware"]["count"] = 2
    config = parse_config(data, origin="t")
    check_planned_fleet(config)
    devices = replica_devices(config, nvlinked(2))
    assert devices is not None
    assert devices.describe() == "r0: 0  r1: 0  r2: 1  r3: 1  (topology)"


def test_each_local_replica_runs_on_its_shared_gpu_at_its_share(tmp_path: Path) -> None:
    config = parse_config(shared_fleet(4, 2, count=2), origin="t")
    replicas = LocalReplicas(config, ResolvedModel(tmp_path, "m"), tmp_path, gpus=nvlinked(2))
    replicas._build(4)
    assert [p.command.env["CUDA_VISIBLE_DEVICES"] for p in replicas.processes] == [
        "0", "0", "1", "1",
    ]  # fmt: skip
    argv = list(replicas.processes[0].command.argv)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.45"


# --- the order they start in -------------------------------------------------------------


def test_the_first_replica_of_each_gpu_starts_at_once_the_next_after_it() -> None:
    steps = start_steps([("r0", 0), ("r1", 1), ("r2", 2)], replicas_per_gpu=2)
    assert [(s.replica_id, s.group, s.after) for s in steps] == [
        ("r0", 0, None), ("r1", 0, "r0"), ("r2", 1, None),
    ]  # fmt: skip
    assert waves(steps) == (("r0", "r2"), ("r1",))
    three = start_steps([(f"r{i}", i) for i in range(6)], replicas_per_gpu=3)
    assert waves(three) == (("r0", "r3"), ("r1", "r4"), ("r2", "r5"))
    assert waves(start_steps([("r0", 0), ("r1", 1)], replicas_per_gpu=1)) == (("r0", "r1"),)


def test_an_added_replica_waits_for_one_still_starting_on_its_gpu() -> None:
    (step,) = start_steps([("r5", 1)], 2, starting=[("r2", 2), ("r4", 0)])
    assert step.after == "r4"
    (alone,) = start_steps([("r5", 3)], 2, starting=[("r4", 0)])
    assert alone.after is None


SIM = parse_config({"engine": {"kind": "sim", "sim_step_ms": 1}}, origin="t")


class SimulatedOnSharedGpus(LocalReplicas):
    """The GPU fleet's replicas, each a real server that answers as vLLM does (a simulated
    replica) in place of vLLM, which this machine cannot run."""

    def _command(
        self, host: str, port: int, slot: int, kv_events: KvEventsPorts | None
    ) -> LaunchCommand:
        return sim_launch_command(SIM, sim_model(SIM.model), host, port)


def test_up_starts_a_gpus_second_replica_once_the_first_is_ready(tmp_path: Path) -> None:
    config = parse_config(shared_fleet(3, 2, count=2), origin="t")
    model = ResolvedModel(tmp_path, "m")
    replicas = SimulatedOnSharedGpus(config, model, tmp_path, gpus=nvlinked(2))
    order: list[str] = []

    def ready(info: ReplicaInfo) -> None:
        waiting = replicas.processes[1].pid is None
        order.append(f"{info.replica_id} ready, r1 {'waiting' if waiting else 'started'}")

    async def body() -> list[ReplicaInfo]:
        replicas.launch()
        assert [p.pid is not None for p in replicas.processes] == [True, False, True]
        assert replicas.deferred() == ("r1 starts after r0 is ready: they share GPU 0",)
        try:
            return await asyncio.wait_for(replicas.wait_ready(ready), 60)
        finally:
            await replicas.stop()

    infos = asyncio.run(body())
    assert [i.replica_id for i in infos] == ["r0", "r1", "r2"]
    assert order.index("r0 ready, r1 waiting") < order.index("r1 ready, r1 started")


def test_a_replica_the_autoscaler_adds_waits_for_its_gpus_neighbour(tmp_path: Path) -> None:
    data = shared_fleet(1, 2, count=1)
    data["autoscale"] = {"enabled": True, "min_replicas": 1, "max_replicas": 2}
    config = parse_config(data, origin="t")
    replicas = SimulatedOnSharedGpus(config, ResolvedModel(tmp_path, "m"), tmp_path,
                                     gpus=nvlinked(1))  # fmt: skip

    async def body() -> tuple[bool, bool]:
        replicas.launch()
        first = replicas.processes[0]
        added = replicas.launch_one()  # r0 still starting on GPU 0
        assert replicas.wait_line("r1") == "r1 starts after r0 is ready: they share GPU 0"
        waited = added.pid is None
        try:
            await asyncio.wait_for(replicas.ready_one(first), 60)
            await asyncio.wait_for(replicas.ready_one(added), 60)
            return waited, added.pid is not None
        finally:
            await replicas.stop()

    assert asyncio.run(body()) == (True, True)


def test_a_failed_start_stops_the_replicas_still_waiting_for_their_gpu(tmp_path: Path) -> None:
    config = parse_config(shared_fleet(2, 2, count=1, startup_timeout_s=30), origin="t")
    replicas = LocalReplicas(config, ResolvedModel(tmp_path / "none", "m"), tmp_path,
                             gpus=nvlinked(1))  # fmt: skip

    async def body() -> None:
        replicas.launch()  # r0 runs a vLLM that is not installed here: it exits at once
        with pytest.raises(EngineStartError, match="r0"):
            await asyncio.wait_for(replicas.wait_ready(), 60)

    asyncio.run(body())
    assert replicas.processes[1].pid is None  # r1 was never started


# --- where replicas cannot share ---------------------------------------------------------


def test_ray_and_kubernetes_refuse_shared_gpus_naming_the_field() -> None:
    config = parse_config(shared_fleet(2, 2), origin="t")
    with pytest.raises(ConfigError, match=r"hardware\.replicas_per_gpu 2: cluster\.backend ray"):
        check_whole_gpus(config)
    with pytest.raises(ConfigError, match="time-slicing or MIG") as caught:
        check_k8s(config)
    assert caught.value.message.startswith("hardware.replicas_per_gpu 2: a Kubernetes pod")
    check_whole_gpus(parse_config(shared_fleet(2, 1), origin="t"))
