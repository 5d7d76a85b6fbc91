"""The GPUs of a local fleet's replica slots (engine/gpu/assign.py over this node's reader),
the one answer `up` launches with and `config` shows."""

from __future__ import annotations

from servepilot.core.config import Device, EngineKind, FleetConfig
from servepilot.core.errors import ConfigError
from servepilot.engine.gpu.assign import DeviceAssignment, assign_devices
from servepilot.engine.gpu.inventory import GpuInventory
from servepilot.engine.gpu.probe import read_gpus
from servepilot.plan.gpu_fit import GpuDemand, check_gpu_fit


def replica_slots(config: FleetConfig) -> int:
    """Replicas that may run at once: replicas.count, or autoscale.max_replicas when that is
    larger and the fleet autoscales (a replica added later needs a GPU slot of its own:
    GPUs of its own, or a share of hardware.replicas_per_gpu)."""
    count = config.replicas.count
    scaling = config.autoscale
    return max(count, scaling.max_replicas) if scaling.enabled else count


def replica_devices(
    config: FleetConfig, inventory: GpuInventory | None = None
) -> DeviceAssignment | None:
    """Each replica slot's GPUs on this node (read now unless `inventory` is given); None
    where replicas use no GPU (CPU, simulated replicas). Raises ConfigError, naming the
    numbers, when the fleet needs more GPUs than it may use."""
    if config.hardware.device is not Device.GPU or config.engine.kind is EngineKind.SIM:
        return None
    node = read_gpus() if inventory is None else inventory
    demand = fleet_demand(config, replica_slots(config))
    return assign_devices(node, demand, config.hardware.gpu_ids, config.hardware.count)


def fleet_demand(config: FleetConfig, replicas: int) -> GpuDemand:
    engine = config.engine
    return GpuDemand(
        replicas=replicas,
        tensor_parallel_size=engine.tensor_parallel_size,
        pipeline_parallel_size=engine.pipeline_parallel_size,
        replicas_per_gpu=config.hardware.replicas_per_gpu,
    )


def check_planned_fleet(config: FleetConfig) -> None:
    """`plan`'s refusal of a GPU fleet.yaml whose replicas (over replicas_per_gpu, rounded
    up) x TP x PP exceed the GPUs it
    declares (hardware.gpu_ids, else hardware.count x hardware.nodes): ConfigError naming
    the numbers."""
    if config.hardware.device is not Device.GPU:
        return
    hardware = config.hardware
    demand = fleet_demand(config, replica_slots(config))
    if hardware.gpu_ids is not None:
        check_gpu_fit(demand, len(hardware.gpu_ids), "hardware.gpu_ids lists")
        return
    where = f"hardware.count x nodes ({hardware.count} x {hardware.nodes}) gives"
    check_gpu_fit(demand, hardware.count * hardware.nodes, where)


def resolved_lines(config: FleetConfig) -> list[str]:
    """What `up` would resolve on this node, as YAML comments (the file stays valid): the
    device-dependent default enforce_eager, and each replica's GPUs."""
    device = config.hardware.device
    eager = config.engine.enforce_eager_on(device)
    why = "set" if config.engine.enforce_eager is not None else f"by device, {device.value}"
    lines = ["# resolved on this node:", f"#   engine.enforce_eager: {str(eager).lower()} ({why})"]
    try:
        devices = replica_devices(config)
    except ConfigError as exc:
        return [*lines, f"#   GPUs: refused: {exc.message}"]
    if devices is not None:
        lines.append(f"#   GPUs per replica: {devices.describe()}")
    return lines
