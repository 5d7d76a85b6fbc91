"""Print what servepilot's GPU reader sees on this node (devices, memory, utilisation,
topology) and the GPUs it would give each replica of two planned fleets.

Runs with the standard library alone, on a GPU machine with only a checkout
(`PYTHONPATH=. python -m servepilot.engine.gpu.report`): NVML through nvidia-ml-py when
installed, else `nvidia-smi`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from servepilot.core.errors import ConfigError
from servepilot.engine.gpu.assign import assign_devices
from servepilot.engine.gpu.inventory import GpuInventory, GpuLink
from servepilot.engine.gpu.probe import read_gpus
from servepilot.plan.gpu_fit import GpuDemand

GIB = 2**30
# (model, replicas, tensor parallel): fleets that fit one 8-GPU node (DeepSeek-V3 at TP 8
# x 8 replicas would take 64 GPUs).
FLEETS = (
    ("llama-3.1-8b", 1, 1),
    ("llama-3.1-8b", 8, 1),
    ("llama-3.1-70b", 2, 4),
    ("llama-3.1-70b", 1, 8),
)
_LINK_CELL = {GpuLink.NVLINK: "NVL", GpuLink.SAME_NUMA: "NUMA", GpuLink.CROSS_NUMA: "SYS"}


def show_inventory(inventory: GpuInventory) -> None:
    print(f"reader: {inventory.source}; devices: {inventory.count}")
    if not inventory.devices:
        print(f"no GPU ({inventory.note})")
        return
    for d in inventory.devices:
        util = "n/a" if d.utilisation_pct is None else f"{d.utilisation_pct:.0f} %"
        numa = "n/a" if d.numa_node is None else str(d.numa_node)
        print(
            f"  GPU{d.index}  {d.name}  memory {d.memory_used_bytes / GIB:.2f} / "
            f"{d.memory_total_bytes / GIB:.2f} GiB used  utilisation {util}  NUMA {numa}"
        )
    if not inventory.has_topology:
        print("topology: not readable")
        return
    indices = [d.index for d in inventory.devices]
    print("topology (NVL = NVLink, NUMA = PCIe in one NUMA node, SYS = across NUMA nodes):")
    print((" " * 9 + "".join(f"GPU{i:<5}" for i in indices)).rstrip())
    for a in indices:
        cells = ["X" if a == b else _cell(inventory.link(a, b)) for b in indices]
        print((f"  GPU{a:<4}" + "".join(f"{c:<8}" for c in cells)).rstrip())


def _cell(link: GpuLink | None) -> str:
    return "?" if link is None else _LINK_CELL[link]


def show_assignments(inventory: GpuInventory) -> None:
    for model, replicas, tp in FLEETS:
        demand = GpuDemand(replicas=replicas, tensor_parallel_size=tp)
        label = f"{model}: {replicas} x TP{tp}"
        try:
            assignment = assign_devices(inventory, demand, declared_count=8)
        except ConfigError as exc:
            print(f"{label}: refused: {exc.message}")
            continue
        print(f"{label}: {assignment.describe()}")


def main(read: Callable[[], GpuInventory] = read_gpus) -> int:
    inventory = read()
    show_inventory(inventory)
    basis = "this node's GPUs" if inventory.devices else "8 GPUs assumed (none readable)"
    print(f"device assignment ({basis}):")
    show_assignments(inventory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
