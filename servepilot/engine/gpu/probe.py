"""The node's GPU reader that everything else imports: NVML when nvidia-ml-py is installed
and answers, else `nvidia-smi`; "no GPU" (an empty inventory, never an error) otherwise."""

from __future__ import annotations

from dataclasses import replace

from servepilot.engine.gpu.inventory import GpuInventory, GpuProbe
from servepilot.engine.gpu.nvml import NvmlProbe
from servepilot.engine.gpu.smi import SmiProbe


class NodeProbe:
    """NVML first; nvidia-smi for what NVML could not read (the devices, or their links)."""

    def __init__(self, nvml: GpuProbe | None = None, smi: SmiProbe | None = None) -> None:
        self._nvml = nvml if nvml is not None else NvmlProbe()
        self._smi = smi if smi is not None else SmiProbe()

    def read(self) -> GpuInventory:
        first = self._nvml.read()
        if not first.devices:
            fallback = self._smi.read()
            if fallback.devices:
                return fallback
            return GpuInventory(note="; ".join(n for n in (first.note, fallback.note) if n))
        if first.has_topology or first.count < 2:
            return first
        links, _ = self._smi.topology()
        return replace(first, links=links) if links else first


def read_gpus() -> GpuInventory:
    """This node's GPUs as the default reader sees them."""
    return NodeProbe().read()
