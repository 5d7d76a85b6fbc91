"""Device assignment: disjoint TP x PP groups per replica, kept inside NVLink / NUMA domains,
known answers on fake topologies; refused with the numbers when the node is too small."""

from __future__ import annotations

import itertools

import pytest

from servepilot.core.errors import ConfigError
from servepilot.engine.gpu.assign import assign_devices
from servepilot.engine.gpu.inventory import NO_GPU, GpuDevice, GpuInventory, GpuLink
from servepilot.plan.gpu_fit import GpuDemand

GIB = 2**30


def node(count: int, link: GpuLink | None, numa: dict[int, int] | None = None) -> GpuInventory:
    """`count` GPUs; every pair linked by `link`, except pairs on different NUMA nodes
    (when given), which cross them."""
    numa = numa or {}
    devices = tuple(GpuDevice(i, "H200", 141 * GIB, 0, 0.0, numa.get(i)) for i in range(count))
    links = {}
    if link is not None:
        for a, b in itertools.combinations(range(count), 2):
            apart = numa and numa[a] != numa[b]
            links[(a, b)] = GpuLink.CROSS_NUMA if apart else link
    return GpuInventory(devices=devices, links=links, source="fake")


ALL_NVLINK = node(8, GpuLink.NVLINK)
# Two NUMA nodes of four GPUs, interleaved as some boards number them: in-order groups of 4
# would straddle both.
INTERLEAVED = node(8, GpuLink.SAME_NUMA, numa={i: i % 2 for i in range(8)})


def assigned(inventory: GpuInventory, replicas: int, tp: int, pp: int = 1) -> list[str]:
    demand = GpuDemand(replicas=replicas, tensor_parallel_size=tp, pipeline_parallel_size=pp)
    result = assign_devices(inventory, demand)
    return [result.visible_devices(n) for n in range(replicas)]


def test_eight_tp1_replicas_get_one_gpu_each() -> None:
    assert assigned(ALL_NVLINK, 8, 1) == ["0", "1", "2", "3", "4", "5", "6", "7"]


def test_two_tp4_replicas_on_all_nvlink_split_the_node_in_order() -> None:
    assert assigned(ALL_NVLINK, 2, 4) == ["0,1,2,3", "4,5,6,7"]
    assert assign_devices(ALL_NVLINK, GpuDemand(2, 4)).basis == "topology"


def test_one_tp8_replica_takes_the_whole_node() -> None:
    assert assigned(ALL_NVLINK, 1, 8) == ["0,1,2,3,4,5,6,7"]


def test_tp4_groups_stay_inside_one_numa_node() -> None:
    assert assigned(INTERLEAVED, 2, 4) == ["0,2,4,6", "1,3,5,7"]


def test_tp2_groups_stay_inside_nvlink_pairs() -> None:
    # PCIe boards with NVLink bridges between 0-5 and 1-4 (and 2-3, 6-7).
    pairs = {(0, 5), (1, 4), (2, 3), (6, 7)}
    devices = tuple(GpuDevice(i, "A100", 80 * GIB, 0, None) for i in range(8))
    links = {
        (a, b): GpuLink.NVLINK if (a, b) in pairs else GpuLink.SAME_NUMA
        for a, b in itertools.combinations(range(8), 2)
    }
    inventory = GpuInventory(devices=devices, links=links, source="fake")
    assert assigned(inventory, 4, 2) == ["0,5", "1,4", "2,3", "6,7"]


def test_tp2_with_two_pipeline_stages_keeps_each_tp_group_in_a_numa_node() -> None:
    assert assigned(INTERLEAVED, 2, 2, pp=2) == ["0,2,4,6", "1,3,5,7"]


def test_three_tp4_replicas_on_eight_gpus_are_refused_with_the_numbers() -> None:
    with pytest.raises(ConfigError) as caught:
        assigned(ALL_NVLINK, 3, 4)
    assert str(caught.value.message) == (
        "the fleet needs 12 GPUs (3 replicas x tensor_parallel_size 4 x "
        "pipeline_parallel_size 1) but this node has 8"
    )
    assert "at most 2 replicas" in str(caught.value.hint)


def test_without_a_readable_gpu_the_declared_count_is_used_in_order() -> None:
    result = assign_devices(NO_GPU, GpuDemand(2, 2), declared_count=4)
    assert [result.visible_devices(n) for n in range(2)] == ["0,1", "2,3"]
    assert result.basis == "in order; no GPU readable here, so hardware.count's 4"
    with pytest.raises(ConfigError, match=r"needs 8 GPUs .* but hardware.count is 4"):
        assign_devices(NO_GPU, GpuDemand(4, 2), declared_count=4)


def test_gpu_ids_override_the_topology_in_their_order() -> None:
    result = assign_devices(ALL_NVLINK, GpuDemand(2, 1), gpu_ids=(6, 3))
    assert [result.visible_devices(n) for n in range(2)] == ["6", "3"]
    assert result.basis == "hardware.gpu_ids"
    with pytest.raises(ConfigError, match=r"needs 2 GPUs .* but hardware.gpu_ids lists 1"):
        assign_devices(ALL_NVLINK, GpuDemand(1, 2), gpu_ids=(5,))


def test_gpu_ids_must_exist_on_the_node() -> None:
    with pytest.raises(ConfigError, match="names GPU 9, which this node does not have"):
        assign_devices(ALL_NVLINK, GpuDemand(1, 1), gpu_ids=(9,))
