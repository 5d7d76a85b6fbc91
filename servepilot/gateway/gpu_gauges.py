"""GPU utilisation and memory of the gateway's host, read through NVML (`nvidia-ml-py`).

vLLM exports no GPU busy figure (DCGM or NVML is where it comes from), and the seeds alert on
it. These gauges exist only where NVML answers: on a host without an NVIDIA driver, or without
the `pynvml` module, the gateway exports none of them, rather than zeros that would read as
"idle GPUs". They describe the GPUs of the gateway's own machine, which with the local backend
are the replicas' GPUs; a multi-node fleet reads the other nodes' from DCGM's exporter.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from servepilot.engine.gpu.nvml import GpuReading, NvmlSampler


class GpuGauges:
    """The GPUs' readings for each scrape, through engine.gpu's NVML sampler (the one place
    servepilot talks to NVML)."""

    def __init__(self, nvml: ModuleType | None = None) -> None:
        """`nvml` stands in for the `pynvml` module (tests); None imports it."""
        self._sampler = NvmlSampler(nvml)

    def readings(self) -> list[GpuReading]:
        return self._sampler.sample()


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
