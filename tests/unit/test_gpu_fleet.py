"""GPU fleets: each local replica's CUDA_VISIBLE_DEVICES, hardware.gpu_ids, the refusal of a
fleet over the node's GPUs, and `--enforce-eager` by device."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from servepilot.cli.main import main
from servepilot.core.config import Device, EngineConfig, parse_config
from servepilot.core.errors import ConfigError
from servepilot.engine.args import ServerSpec, server_args, vllm_command
from servepilot.engine.gpu.inventory import NO_GPU, GpuDevice, GpuInventory, GpuLink
from servepilot.engine.model_source import ResolvedModel
from servepilot.engine.simserver.args import SimModel
from servepilot.fleet.devices import check_planned_fleet, replica_devices, resolved_lines
from servepilot.fleet.local import LocalReplicas

GIB = 2**30
SPEC = ServerSpec(model_path="/m", served_name="m", host="127.0.0.1", port=8000)


def nvlinked(count: int) -> GpuInventory:
    devices = tuple(GpuDevice(i, "NVIDIA H200", 141 * GIB, 0, 0.0) for i in range(count))
    links = {pair: GpuLink.NVLINK for pair in itertools.combinations(range(count), 2)}
    return GpuInventory(devices=devices, links=links, source="fake")


def gpu_fleet(replicas: int, tp: int, **hardware: object) -> dict[str, object]:
    return {
        "hardware": {"device": "gpu", "accelerator": "h200-141", "count": 8, **hardware},
        "engine": {"tensor_parallel_size": tp},
        "replicas": {"count": replicas},
    }


def visible(replicas: LocalReplicas) -> list[str]:
    return [p.command.env["CUDA_VISIBLE_DEVICES"] for p in replicas.processes]


def test_each_local_replica_gets_its_own_gpus(tmp_path: Path) -> None:
    config = parse_config(gpu_fleet(2, 4), origin="test")
    model = ResolvedModel(path=tmp_path, served_name="m")
    replicas = LocalReplicas(config, model, tmp_path, gpus=nvlinked(8))
    replicas._build(2)
    assert visible(replicas) == ["0,1,2,3", "4,5,6,7"]
    assert "--enforce-eager" not in replicas.processes[0].command.argv


def test_an_added_replica_takes_the_slot_a_removed_one_freed(tmp_path: Path) -> None:
    data = gpu_fleet(2, 1)
    data["autoscale"] = {"enabled": True, "min_replicas": 1, "max_replicas": 3}
    config = parse_config(data, origin="test")
    replicas = LocalReplicas(config, ResolvedModel(tmp_path, "m"), tmp_path, gpus=nvlinked(8))
    replicas._build(2)
    replicas.processes.pop(0)  # r0 (GPU 0) was stopped
    replicas.processes.append(replicas._process(2))
    assert visible(replicas) == ["1", "0"]


def test_a_fleet_over_the_node_fails_up_naming_the_numbers(tmp_path: Path) -> None:
    config = parse_config(gpu_fleet(3, 4), origin="test")
    with pytest.raises(ConfigError, match=r"needs 12 GPUs .* but this node has 8"):
        LocalReplicas(config, ResolvedModel(tmp_path, "m"), tmp_path, gpus=nvlinked(8))


def test_gpu_ids_pick_the_replicas_gpus() -> None:
    config = parse_config(gpu_fleet(2, 1, gpu_ids=[5, 2]), origin="test")
    devices = replica_devices(config, nvlinked(8))
    assert devices is not None and devices.replicas == ((5,), (2,))


def test_gpu_ids_are_validated_by_name() -> None:
    with pytest.raises(ConfigError, match=r"hardware.gpu_ids: .*GPU 3 more than once"):
        parse_config(gpu_fleet(1, 1, gpu_ids=[3, 1, 3]), origin="test")
    with pytest.raises(ConfigError, match=r"hardware.gpu_ids: .*negative"):
        parse_config(gpu_fleet(1, 1, gpu_ids=[-1]), origin="test")


def test_cpu_and_simulated_fleets_use_no_gpu() -> None:
    assert replica_devices(parse_config({}, origin="test"), NO_GPU) is None
    sim = gpu_fleet(2, 1)
    sim["engine"] = {"kind": "sim"}
    assert replica_devices(parse_config(sim, origin="test"), NO_GPU) is None
    config = parse_config({"engine": {"kind": "sim"}, "replicas": {"count": 2}}, origin="t")
    replicas = LocalReplicas(config, SimModel("llama-3.1-8b", "m", None), Path("/tmp"))
    assert replicas.devices is None


def test_enforce_eager_defaults_by_device() -> None:
    engine = EngineConfig()
    assert engine.enforce_eager is None
    assert "--enforce-eager" in server_args(engine, SPEC, Device.CPU)
    assert "--enforce-eager" not in server_args(engine, SPEC, Device.GPU)
    forced = EngineConfig(enforce_eager=True)
    assert "--enforce-eager" in server_args(forced, SPEC, Device.GPU)
    graphs = EngineConfig(enforce_eager=False)
    assert "--enforce-eager" not in server_args(graphs, SPEC, Device.CPU)


def test_the_printed_gpu_command_captures_cuda_graphs() -> None:
    config = parse_config(gpu_fleet(1, 8), origin="test")
    assert "--enforce-eager" not in vllm_command(config, "deepseek-ai/DeepSeek-V3", "ds")


def test_config_shows_the_resolved_default_and_the_gpus(tmp_path: Path) -> None:

    assert resolved_lines(parse_config({}, origin="t")) == [
        "# resolved on this node:",
        "#   engine.enforce_eager: true (by device, cpu)",
    ]
    lines = resolved_lines(parse_config(gpu_fleet(2, 4), origin="t"))
    assert lines[1] == "#   engine.enforce_eager: false (by device, gpu)"
    assert lines[2] == (
        "#   GPUs per replica: r0: 0,1,2,3  r1: 4,5,6,7  "
        "(in order; no GPU readable here, so hardware.count's 8)"
    )
    refused = resolved_lines(parse_config(gpu_fleet(3, 4), origin="t"))
    assert refused[2].startswith("#   GPUs: refused: the fleet needs 12 GPUs")


def test_plan_refuses_a_fleet_over_its_declared_gpus() -> None:

    with pytest.raises(ConfigError, match=r"needs 12 GPUs .* \(8 x 1\) gives 8"):
        check_planned_fleet(parse_config(gpu_fleet(3, 4), origin="t"))
    check_planned_fleet(parse_config(gpu_fleet(2, 4), origin="t"))


def test_the_plan_command_fails_naming_the_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "hardware: {device: gpu, accelerator: h200-141, count: 8}\n"
        "model: {source: llama-3.1-70b}\nengine: {tensor_parallel_size: 4}\nreplicas: {count: 3}\n"
    )
    assert main(["plan", "-c", str(fleet)]) != 0
    assert "the fleet needs 12 GPUs" in capsys.readouterr().err
