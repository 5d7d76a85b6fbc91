"""The node's GPU reader: NVML through a fake pynvml, nvidia-smi through recorded outputs,
and "no GPU" without an error on this machine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from servepilot.engine.gpu.inventory import GpuDevice, GpuInventory, GpuLink
from servepilot.engine.gpu.nvml import NvmlProbe
from servepilot.engine.gpu.probe import NodeProbe, read_gpus
from servepilot.engine.gpu.smi import (
    QUERY_ARGS,
    TOPOLOGY_ARGS,
    SmiProbe,
    parse_query,
    parse_topology,
)

DATA = Path(__file__).parent.parent / "data" / "nvidia_smi"
GIB = 2**30


class NVMLError(Exception):
    pass


class FakeNvml:
    """pynvml's calls the reader makes, over `count` GPUs; NVLink between the pairs given."""

    NVML_P2P_CAPS_INDEX_NVLINK = 6
    NVML_P2P_STATUS_OK = 0
    NVML_TOPOLOGY_NODE = 40
    NVML_TOPOLOGY_SYSTEM = 50

    def __init__(self, count: int, nvlink: set[tuple[int, int]], numa: dict[int, int]) -> None:
        self.count = count
        self.nvlink = nvlink
        self.numa = numa
        self.shut_down = False

    def nvmlInit(self) -> None:
        return None

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=141 * GIB, used=(handle + 1) * GIB)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=10 * handle)

    def nvmlDeviceGetNumaNodeId(self, handle: int) -> int:
        return self.numa[handle]

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, index: int) -> int:
        return 0 if (min(a, b), max(a, b)) in self.nvlink else 4

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 40 if self.numa[a] == self.numa[b] else 50


class NoDriver:
    def nvmlInit(self) -> None:
        raise NVMLError("NVML Shared Library Not Found")


def test_nvml_reads_devices_memory_utilisation_and_links() -> None:
    fake = FakeNvml(4, nvlink={(0, 1), (2, 3)}, numa={0: 0, 1: 0, 2: 1, 3: 1})
    inventory = NvmlProbe(fake).read()
    assert inventory.source == "nvml"
    assert inventory.devices[2] == GpuDevice(2, "NVIDIA H200", 141 * GIB, 3 * GIB, 20.0, 1)
    assert inventory.link(1, 0) is GpuLink.NVLINK
    assert inventory.link(0, 2) is GpuLink.CROSS_NUMA
    assert inventory.link(2, 3) is GpuLink.NVLINK
    assert len(inventory.links) == 6
    assert fake.shut_down


def test_nvml_without_a_driver_is_no_gpu() -> None:
    inventory = NvmlProbe(NoDriver()).read()
    assert inventory.devices == () and inventory.source == "none"
    assert "Shared Library Not Found" in inventory.note


def test_this_machine_reads_as_no_gpu_without_error() -> None:
    inventory = read_gpus()
    assert inventory.count == 0
    assert inventory.note


def test_nvidia_smi_query_of_a_real_h200() -> None:
    (device,) = parse_query((DATA / "query_h200_1gpu.txt").read_text())
    assert device.name == "NVIDIA H200"
    assert device.memory_total_bytes == 143771 * 2**20
    assert device.memory_used_bytes == 0 and device.utilisation_pct == 0.0


def test_topology_of_eight_nvlinked_h100s_on_two_numa_nodes() -> None:
    links, numa = parse_topology((DATA / "topo_h100_nv18_2numa.txt").read_text())
    assert len(links) == 28 and set(links.values()) == {GpuLink.NVLINK}
    assert numa == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_topology_of_pcie_gpus_past_the_nic_columns() -> None:
    links, numa = parse_topology((DATA / "topo_4090_sys_2numa.txt").read_text())
    assert set(links.values()) == {GpuLink.CROSS_NUMA} and len(links) == 28
    assert numa[3] == 0 and numa[6] == 1


def test_topology_header_with_terminal_escapes_of_one_gpu() -> None:
    links, numa = parse_topology((DATA / "topo_h200_1gpu.txt").read_text())
    assert links == {} and numa == {0: 0}


def test_pcie_levels_inside_one_numa_node() -> None:
    text = "\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n" + "\n".join(
        [
            "GPU0\t X \tPIX\tSYS\t0-9\t0",
            "GPU1\tPIX\t X \tSYS\t0-9\t0",
            "GPU2\tSYS\tSYS\t X \t10-19\t1",
        ]
    )
    links, numa = parse_topology(text)
    assert links == {
        (0, 1): GpuLink.SAME_NUMA,
        (0, 2): GpuLink.CROSS_NUMA,
        (1, 2): GpuLink.CROSS_NUMA,
    }
    assert numa == {0: 0, 1: 0, 2: 1}


def recorded(query: str, topology: str) -> Any:
    def run(args: Sequence[str]) -> str | None:
        if tuple(args) == QUERY_ARGS:
            return (DATA / query).read_text()
        return (DATA / topology).read_text() if tuple(args) == TOPOLOGY_ARGS else None

    return run


def test_without_nvml_the_node_is_read_through_nvidia_smi() -> None:
    smi = SmiProbe(recorded("query_h200_1gpu.txt", "topo_h200_1gpu.txt"))
    inventory = NodeProbe(nvml=NvmlProbe(NoDriver()), smi=smi).read()
    assert inventory.source == "nvidia-smi" and inventory.count == 1
    assert inventory.devices[0].numa_node == 0


def test_nvidia_smi_topology_fills_in_what_nvml_could_not_read() -> None:
    class NvmlWithoutLinks:
        def read(self) -> GpuInventory:
            devices = tuple(GpuDevice(i, "H100", 80 * GIB, 0, 0.0) for i in range(8))
            return GpuInventory(devices=devices, source="nvml")

    smi = SmiProbe(recorded("query_h200_1gpu.txt", "topo_h100_nv18_2numa.txt"))
    inventory = NodeProbe(nvml=NvmlWithoutLinks(), smi=smi).read()
    assert inventory.source == "nvml" and inventory.link(3, 7) is GpuLink.NVLINK


def test_no_nvml_and_no_nvidia_smi_is_no_gpu() -> None:
    inventory = NodeProbe(nvml=NvmlProbe(NoDriver()), smi=SmiProbe(lambda args: None)).read()
    assert inventory.count == 0
    assert "nvidia-smi is absent" in inventory.note
