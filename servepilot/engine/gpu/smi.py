"""Read the GPUs through the `nvidia-smi` command: the fallback where nvidia-ml-py is not
installed (or NVML cannot say how the GPUs are linked)."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable, Sequence

from servepilot.engine.gpu.inventory import GpuDevice, GpuInventory, GpuLink

QUERY_ARGS = (
    "--query-gpu=index,name,memory.total,memory.used,utilization.gpu",
    "--format=csv,noheader,nounits",
)
TOPOLOGY_ARGS = ("topo", "-m")
_MIB = 2**20
_GPU_COLUMN = re.compile(r"GPU\d+$")
_NIC_COLUMN = re.compile(r"(NIC\d+|mlx\S+)$")
# Within one NUMA node: the same PCIe switch (PIX), several switches (PXB), the host bridge
# (PHB), several host bridges of one node (NODE). SYS crosses the CPUs' interconnect.
_SAME_NUMA = {"PIX", "PXB", "PHB", "NODE"}
# nvidia-smi underlines the header with terminal escapes even when writing to a pipe.
_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")

Runner = Callable[[Sequence[str]], str | None]
"""Runs nvidia-smi with these arguments; its stdout, or None when it failed or is absent."""


def run_nvidia_smi(args: Sequence[str]) -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_query(text: str) -> tuple[GpuDevice, ...]:
    """Devices from `nvidia-smi --query-gpu=...` (QUERY_ARGS): memory in MiB, load in %."""
    devices = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != 5 or not cells[0].isdigit():
            continue
        index, name, total_mib, used_mib, util = cells
        devices.append(
            GpuDevice(
                index=int(index),
                name=name,
                memory_total_bytes=int(float(total_mib) * _MIB),
                memory_used_bytes=int(float(used_mib) * _MIB),
                utilisation_pct=_number(util),
            )
        )
    return tuple(devices)


def parse_topology(text: str) -> tuple[dict[tuple[int, int], GpuLink], dict[int, int]]:
    """(link of every GPU pair, NUMA node of each GPU) from `nvidia-smi topo -m`."""
    lines = [line for line in _ESCAPE.sub("", text).splitlines() if line.strip()]
    header = next((line.split() for line in lines if "GPU0" in line.split()[:2]), None)
    if header is None:
        return {}, {}
    gpus = sum(1 for cell in header if _GPU_COLUMN.match(cell))
    nics = sum(1 for cell in header if _NIC_COLUMN.match(cell))
    links: dict[tuple[int, int], GpuLink] = {}
    numa: dict[int, int] = {}
    for line in lines:
        cells = line.split()
        if not _GPU_COLUMN.match(cells[0]) or len(cells) < gpus + 1:
            continue
        row = int(cells[0][3:])
        for col, cell in enumerate(cells[1 : gpus + 1]):
            link = _link(cell)
            if link is not None and col != row:
                links[(min(row, col), max(row, col))] = link
        # After the GPU and NIC columns: CPU Affinity, then NUMA Affinity.
        rest = cells[gpus + nics + 1 :]
        if len(rest) >= 2 and rest[1].isdigit():
            numa[row] = int(rest[1])
    return links, numa


class SmiProbe:
    """Devices from `nvidia-smi --query-gpu`, topology from `nvidia-smi topo -m`."""

    def __init__(self, runner: Runner = run_nvidia_smi) -> None:
        self._run = runner

    def read(self) -> GpuInventory:
        query = self._run(QUERY_ARGS)
        if query is None:
            return GpuInventory(note="nvidia-smi is absent or failed")
        devices = parse_query(query)
        if not devices:
            return GpuInventory(note="nvidia-smi listed no GPU")
        links, numa = self.topology()
        devices = tuple(_with_numa(d, numa.get(d.index)) for d in devices)
        return GpuInventory(devices=devices, links=links, source="nvidia-smi")

    def topology(self) -> tuple[dict[tuple[int, int], GpuLink], dict[int, int]]:
        text = self._run(TOPOLOGY_ARGS)
        return parse_topology(text) if text else ({}, {})


def _link(cell: str) -> GpuLink | None:
    if cell.startswith("NV"):
        return GpuLink.NVLINK
    if cell in _SAME_NUMA:
        return GpuLink.SAME_NUMA
    if cell == "SYS":
        return GpuLink.CROSS_NUMA
    return None  # X (itself)


def _with_numa(device: GpuDevice, numa: int | None) -> GpuDevice:
    if numa is None:
        return device
    return GpuDevice(
        index=device.index,
        name=device.name,
        memory_total_bytes=device.memory_total_bytes,
        memory_used_bytes=device.memory_used_bytes,
        utilisation_pct=device.utilisation_pct,
        numa_node=numa,
    )


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]" on GPUs that do not report it
        return None
