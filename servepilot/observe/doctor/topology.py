"""GPU topology for tensor parallelism (seed 004: "TP grows, throughput drops: across NUMA or
without NVLink; check nvidia-smi topo -m, keep TP inside the NVLink domain").

`nvidia-smi topo -m` prints a matrix: a row per GPU, a column per GPU, each cell the link
between the two: `NV<n>` (NVLink, n links), `PIX`/`PXB` (PCIe switches), `PHB` (the host
bridge), `NODE` (across PCIe host bridges in one NUMA node), `SYS` (across NUMA nodes).
"""

from __future__ import annotations

from servepilot.core.config import Device
from servepilot.engine.gpu.inventory import GpuLink
from servepilot.engine.gpu.smi import parse_topology
from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.finding import Finding, Severity

_LINK_TEXT = {
    GpuLink.NVLINK: "NVLink",
    GpuLink.SAME_NUMA: "PCIe within one NUMA node",
    GpuLink.CROSS_NUMA: "SYS, across NUMA nodes",
}

Links = dict[tuple[int, int], GpuLink]


def _link(links: Links, a: int, b: int) -> GpuLink | None:
    return links.get((min(a, b), max(a, b)))


def nvlink_clique(links: Links, first: int, size: int) -> int:
    """How many GPUs from `first` on (at most `size`) are all linked by NVLink pairwise."""
    count = 1
    while count < size:
        nxt = first + count
        if not all(_link(links, gpu, nxt) is GpuLink.NVLINK for gpu in range(first, nxt)):
            break
        count += 1
    return count


def gpu_topology(evidence: Evidence) -> list[Finding]:
    config = evidence.config
    tp = config.engine.tensor_parallel_size
    if config.hardware.device is not Device.GPU or tp < 2 or evidence.env.gpu_topology is None:
        return []
    links, _ = parse_topology(evidence.env.gpu_topology)
    gpus = sorted({gpu for pair in links for gpu in pair})
    found = []
    # Replicas take consecutive GPUs: replica k holds GPUs k*tp .. k*tp + tp - 1.
    for first in range(0, len(gpus) - tp + 1, tp):
        reach = nvlink_clique(links, first, tp)
        if reach == tp:
            continue
        bad = next(
            (a, b, _link(links, a, b))
            for b in range(first + 1, first + tp)
            for a in range(first, b)
            if _link(links, a, b) is not GpuLink.NVLINK
        )
        how = _LINK_TEXT[bad[2]] if bad[2] is not None else "not linked"
        fitting = 1 << (reach.bit_length() - 1)  # TP sizes are powers of two
        found.append(
            Finding(
                "gpu_topology",
                Severity.PROBLEM,
                f"tensor parallelism {tp} over GPU{first}-GPU{first + tp - 1} leaves the NVLink "
                "domain: every layer's all-reduce crosses PCIe or the CPU interconnect",
                evidence=f"nvidia-smi topo -m: GPU{bad[0]} <-> GPU{bad[1]} is {how}",
                fix=f"keep TP inside the NVLink domain: engine.tensor_parallel_size {tp} -> "
                f"{fitting}, and run more replicas (replicas.count) on the freed GPUs",
                knob="engine.tensor_parallel_size",
                value=str(fitting),
            )
        )
        break  # one finding: the fix is the same for every replica
    return found
