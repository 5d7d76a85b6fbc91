"""Read the GPUs through NVML (package nvidia-ml-py, module `pynvml`).

The module imports on a machine without a GPU or driver; `nvmlInit` then raises, which reads
as "no GPU" here, never as an error."""

from __future__ import annotations

import importlib
import itertools
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from servepilot.engine.gpu.inventory import GpuDevice, GpuInventory, GpuLink

log = logging.getLogger(__name__)


def load_pynvml() -> ModuleType | None:
    """The `pynvml` module, or None when nvidia-ml-py is not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        return None


class NvmlProbe:
    """Devices, memory, utilisation and topology from NVML; `nvml` is the pynvml module
    (a fake in tests)."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml if nvml is not None else load_pynvml()

    def read(self) -> GpuInventory:
        nvml = self._nvml
        if nvml is None:
            return GpuInventory(note="nvidia-ml-py is not installed")
        try:
            nvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPU
            return GpuInventory(note=f"NVML: {exc}")
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
            devices = tuple(_device(nvml, i, h) for i, h in enumerate(handles))
            return GpuInventory(devices=devices, links=_links(nvml, handles), source="nvml")
        except Exception as exc:  # a driver that answers init but not the queries
            return GpuInventory(note=f"NVML: {exc}")
        finally:
            _shutdown(nvml)


def _device(nvml: Any, index: int, handle: Any) -> GpuDevice:
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    name = nvml.nvmlDeviceGetName(handle)
    return GpuDevice(
        index=index,
        name=name.decode() if isinstance(name, bytes) else str(name),
        memory_total_bytes=int(memory.total),
        memory_used_bytes=int(memory.used),
        utilisation_pct=_optional(lambda: float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)),
        numa_node=_optional(lambda: int(nvml.nvmlDeviceGetNumaNodeId(handle))),
    )


def _links(nvml: Any, handles: list[Any]) -> dict[tuple[int, int], GpuLink]:
    """The link of every pair; empty when the driver does not answer (topology unknown)."""
    links: dict[tuple[int, int], GpuLink] = {}
    try:
        for a, b in itertools.combinations(range(len(handles)), 2):
            links[(a, b)] = _link(nvml, handles[a], handles[b])
    except Exception:  # older drivers and vGPUs refuse topology queries
        return {}
    return links


def _link(nvml: Any, a: Any, b: Any) -> GpuLink:
    nvlink = nvml.nvmlDeviceGetP2PStatus(a, b, nvml.NVML_P2P_CAPS_INDEX_NVLINK)
    if nvlink == nvml.NVML_P2P_STATUS_OK:
        return GpuLink.NVLINK
    level = nvml.nvmlDeviceGetTopologyCommonAncestor(a, b)
    return GpuLink.CROSS_NUMA if level >= nvml.NVML_TOPOLOGY_SYSTEM else GpuLink.SAME_NUMA


def _optional(read: Any) -> Any:
    try:
        return read()
    except Exception:  # a query this GPU or driver does not support
        return None


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # already shut down: nothing to release
        return


@dataclass(frozen=True, slots=True)
class GpuReading:
    """What a metrics scrape reads of one GPU."""

    index: int
    utilization: float
    """Share of the last sample period the GPU ran a kernel, 0..1 (NVML's gpu utilisation)."""
    memory_used_bytes: int
    memory_total_bytes: int


class NvmlSampler:
    """Utilisation and memory of every GPU, NVML opened once on the first sample and kept
    open (a scrape a second must not pay nvmlInit); `nvml` is the pynvml module (a fake in
    tests), None to import it."""

    def __init__(self, nvml: Any | None = None) -> None:
        self._nvml = nvml
        self._handles: list[Any] | None = None

    def sample(self) -> list[GpuReading]:
        """One reading per GPU; empty where NVML is missing or fails (never a made-up value)."""
        handles = self._open()
        if not handles:
            return []
        nvml: Any = self._nvml  # set by _open whenever it found handles
        out = []
        try:
            for index, handle in enumerate(handles):
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                out.append(GpuReading(index, rates.gpu / 100.0, int(memory.used),
                                      int(memory.total)))  # fmt: skip
        except Exception as exc:  # NVMLError: a GPU that fell off the bus
            log.warning("NVML read failed, GPU readings left out of this sample: %s", exc)
            return []
        return out

    def _open(self) -> list[Any]:
        if self._handles is None:
            self._handles = self._init()
        return self._handles

    def _init(self) -> list[Any]:
        if self._nvml is None:
            self._nvml = load_pynvml()
        nvml = self._nvml
        if nvml is None:
            return []
        try:
            nvml.nvmlInit()
            return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as exc:  # no driver, no GPU
            log.debug("no NVML here (%s): no GPU readings", exc)
            return []
