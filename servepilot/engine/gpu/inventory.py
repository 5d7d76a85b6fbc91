"""What a GPU probe reads: the devices, their memory and load, and how they are linked."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol


class GpuLink(enum.IntEnum):
    """How two GPUs reach each other, best first (the order the assignment prefers); from 1,
    so that no link reads as false."""

    NVLINK = 1
    SAME_NUMA = 2
    """PCIe within one NUMA node (nvidia-smi's PIX, PXB, PHB, NODE)."""
    CROSS_NUMA = 3
    """PCIe across the CPUs' interconnect (nvidia-smi's SYS)."""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilisation_pct: float | None
    numa_node: int | None = None


@dataclass(frozen=True, slots=True)
class GpuInventory:
    """The GPUs of this node as one probe read them; no devices means no GPU (or none readable)."""

    devices: tuple[GpuDevice, ...] = ()
    links: dict[tuple[int, int], GpuLink] = field(default_factory=dict)
    """Link between two device indices, stored once per pair (lower index first); empty when
    the topology could not be read."""
    source: str = "none"
    """Which reader answered: `nvml`, `nvidia-smi`, or `none`."""
    note: str = ""
    """Why there are no devices (the reader's error), for the user."""

    @property
    def count(self) -> int:
        return len(self.devices)

    def link(self, a: int, b: int) -> GpuLink | None:
        return self.links.get((min(a, b), max(a, b)))

    @property
    def has_topology(self) -> bool:
        return bool(self.links)


NO_GPU = GpuInventory()


class GpuProbe(Protocol):
    """The one seam every reader of the node's GPUs sits behind (fakes implement it in tests)."""

    def read(self) -> GpuInventory: ...
