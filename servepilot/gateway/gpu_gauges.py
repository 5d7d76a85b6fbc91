"""GPU utilisation and memory of the gateway's host, read through NVML (`nvidia-ml-py`).

vLLM exports no GPU busy figure (DCGM or NVML is where it comes from), and the seeds alert on
it. These gauges exist only where NVML answers: on a host without an NVIDIA driver, or without
the `pynvml` module, the gateway exports none of them, rather than zeros that would read as
"idle GPUs". They describe the GPUs of the gateway's own machine, which with the local backend
are the replicas' GPUs; a multi-node fleet reads the other nodes' from DCGM's exporter.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuReading:
    index: int
    utilization: float
    """Share of the last sample period the GPU ran a kernel, 0..1 (NVML's gpu utilisation)."""
    memory_used_bytes: int
    memory_total_bytes: int


class GpuGauges:
    """NVML opened once, on the first scrape; every later scrape reads each device."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        """`nvml` stands in for the `pynvml` module (tests); None imports it."""
        self._nvml = nvml
        self._handles: list[Any] | None = None
        self._opened = False

    def readings(self) -> list[GpuReading]:
        """One reading per GPU; empty where NVML is missing or fails (never a made-up value)."""
        handles = self._open()
        if not handles:
            return []
        nvml = self._nvml
        assert nvml is not None
        out = []
        try:
            for index, handle in enumerate(handles):
                rates = nvml.nvmlDeviceGetUtilizationRates(handle)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                out.append(GpuReading(index, rates.gpu / 100.0, int(memory.used),
                                      int(memory.total)))  # fmt: skip
        except nvml.NVMLError as exc:
            # A GPU that fell off the bus must not take /metrics down with it.
            log.warning("NVML read failed, GPU gauges left out of this scrape: %s", exc)
            return []
        return out

    def _open(self) -> list[Any]:
        if not self._opened:
            self._opened = True
            self._handles = self._init()
        return self._handles or []

    def _init(self) -> list[Any]:
        if self._nvml is None:
            try:
                import pynvml
            except ImportError:
                return []
            self._nvml = pynvml
        nvml = self._nvml
        try:
            nvml.nvmlInit()
            return [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except nvml.NVMLError as exc:
            log.debug("no NVML here (%s): no GPU gauges", exc)
            return []


def gpu_families(gauges: GpuGauges) -> Iterator[Metric]:
    readings = gauges.readings()
    if not readings:
        return
    busy = GaugeMetricFamily("servepilot_gpu_utilization", "Share of time the GPU ran a "
                             "kernel (NVML), 0..1, by GPU index.", labels=["gpu"])  # fmt: skip
    used = GaugeMetricFamily("servepilot_gpu_memory_used_bytes", "GPU memory in use (NVML), "
                             "by GPU index.", labels=["gpu"])  # fmt: skip
    total = GaugeMetricFamily("servepilot_gpu_memory_total_bytes", "GPU memory installed "
                              "(NVML), by GPU index.", labels=["gpu"])  # fmt: skip
    for r in readings:
        busy.add_metric([str(r.index)], r.utilization)
        used.add_metric([str(r.index)], float(r.memory_used_bytes))
        total.add_metric([str(r.index)], float(r.memory_total_bytes))
    yield from (busy, used, total)
