"""Which GPUs each replica of a fleet gets: disjoint groups of TP x PP devices, each tensor
parallel group inside one NVLink domain (else one NUMA node) when the topology is known, else
in index order; with replicas_per_gpu > 1, consecutive replica slots share one group. A pure
function of the inventory and the fleet."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servepilot.core.errors import ConfigError
from servepilot.engine.gpu.inventory import GpuInventory, GpuLink
from servepilot.plan.gpu_fit import GpuDemand, check_gpu_fit


@dataclass(frozen=True, slots=True)
class DeviceAssignment:
    replicas: tuple[tuple[int, ...], ...]
    """GPU indices of each replica slot, in CUDA_VISIBLE_DEVICES order (slots that share a
    GPU group hold the same indices)."""
    basis: str
    """How they were chosen: `topology`, `in order` or `hardware.gpu_ids`."""
    replicas_per_gpu: int = 1
    """Replica slots sharing each GPU group: slot k runs on group k // replicas_per_gpu."""

    def group_of(self, replica: int) -> int:
        """The GPU group replica slot `replica` runs on (shared with its neighbours)."""
        return replica // self.replicas_per_gpu

    def visible_devices(self, replica: int) -> str:
        """CUDA_VISIBLE_DEVICES for replica slot `replica`."""
        return ",".join(str(i) for i in self.replicas[replica])

    def describe(self) -> str:
        groups = "  ".join(f"r{n}: {self.visible_devices(n)}" for n in range(len(self.replicas)))
        return f"{groups}  ({self.basis})"


def assign_devices(
    inventory: GpuInventory,
    demand: GpuDemand,
    gpu_ids: tuple[int, ...] | None = None,
    declared_count: int = 1,
) -> DeviceAssignment:
    """The GPUs of `demand`'s replicas on this node: from `gpu_ids` when given (in their
    order), else from the inventory's devices, else (none readable) from GPUs
    0..`declared_count`-1 (hardware.count). Raises ConfigError, naming the numbers, when the
    demand does not fit."""
    ids = _usable_ids(inventory, gpu_ids, declared_count)
    if gpu_ids is not None:
        check_gpu_fit(demand, len(ids), "hardware.gpu_ids lists")
    elif inventory.devices:
        check_gpu_fit(demand, len(ids), "this node has")
    else:
        check_gpu_fit(demand, len(ids), "hardware.count is")
    domains = _domains(inventory, ids)
    free = list(ids)
    groups = []
    for _ in range(demand.groups):
        group: list[int] = []
        for _ in range(demand.pipeline_parallel_size):
            group += _take(free, demand.tensor_parallel_size, domains)
        groups.append(tuple(group))
    chosen = [groups[demand.group_of(slot)] for slot in range(demand.replicas)]
    basis = "in order"
    if gpu_ids is not None:
        basis = "hardware.gpu_ids"
    elif domains:
        basis = "topology"
    elif not inventory.devices:
        basis = f"in order; no GPU readable here, so hardware.count's {declared_count}"
    return DeviceAssignment(tuple(chosen), basis, demand.replicas_per_gpu)


def _usable_ids(
    inventory: GpuInventory, gpu_ids: tuple[int, ...] | None, count: int
) -> tuple[int, ...]:
    present = tuple(d.index for d in inventory.devices) or tuple(range(count))
    if gpu_ids is None:
        return present
    missing = [i for i in gpu_ids if i not in present]
    if inventory.devices and missing:
        raise ConfigError(
            f"hardware.gpu_ids names GPU {missing[0]}, which this node does not have "
            f"(it has {inventory.count}: {', '.join(str(i) for i in present)})"
        )
    return gpu_ids


def _domains(inventory: GpuInventory, ids: tuple[int, ...]) -> list[list[list[int]]]:
    """GPU groups from the tightest link to the loosest: NVLink domains, then NUMA domains
    (PCIe within a node, or the same NUMA affinity). Empty when the topology is unknown."""
    if not inventory.has_topology:
        return []
    numa = {d.index: d.numa_node for d in inventory.devices}

    def nvlink(a: int, b: int) -> bool:
        return inventory.link(a, b) is GpuLink.NVLINK

    def same_numa(a: int, b: int) -> bool:
        link = inventory.link(a, b)
        shared_node = numa.get(a) is not None and numa.get(a) == numa.get(b)
        return shared_node or (link is not None and link <= GpuLink.SAME_NUMA)

    return [_components(ids, nvlink), _components(ids, same_numa)]


def _components(ids: Sequence[int], joined: Callable[[int, int], bool]) -> list[list[int]]:
    """The groups of `ids` that `joined` links (transitively), each in the order of `ids`."""
    groups: list[list[int]] = []
    for gpu in ids:
        linked = [g for g in groups if any(joined(gpu, other) for other in g)]
        merged = [gpu] + [other for g in linked for other in g]
        groups = [g for g in groups if g not in linked] + [sorted(merged, key=ids.index)]
    return groups


def _take(free: list[int], size: int, levels: list[list[list[int]]]) -> list[int]:
    """`size` GPUs from `free` (removed from it): from the fullest domain that still holds
    them at the tightest level that can (so whole domains stay free for later groups), else
    the first free ones."""
    for domains in levels:
        open_ = [[g for g in d if g in free] for d in domains]
        fitting = [d for d in open_ if len(d) >= size]
        if fitting:
            best = min(fitting, key=lambda d: (len(d), free.index(d[0])))
            return _remove(free, best[:size])
    return _remove(free, free[:size])


def _remove(free: list[int], taken: list[int]) -> list[int]:
    for gpu in taken:
        free.remove(gpu)
    return taken
