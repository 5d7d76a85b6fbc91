"""GPU topology for tensor parallelism (seed 004: "TP grows, throughput drops: across NUMA or
without NVLink; check nvidia-smi topo -m, keep TP inside the NVLink domain").

`nvidia-smi topo -m` prints a matrix: a row per GPU, a column per GPU, each cell the link
between the two: `NV<n>` (NVLink, n links), `PIX`/`PXB` (PCIe switches), `PHB` (the host
bridge), `NODE` (across PCIe host bridges in one NUMA node), `SYS` (across NUMA nodes).
"""

from __future__ import annotations

import re

from servepilot.core.config import Device
from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.finding import Finding, Severity

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def parse_topology(text: str) -> dict[tuple[int, int], str]:
    """The link between each pair of GPUs (both orders), from `nvidia-smi topo -m`."""
    plain = _ANSI.sub("", text)  # the driver underlines the header, even into a pipe
    lines = [line.split() for line in plain.splitlines() if line.strip()]
    header = next((cells for cells in lines if cells and cells[0].startswith("GPU")), None)
    if header is None:
        return {}
    gpus = [int(c[3:]) for c in header if c.startswith("GPU") and c[3:].isdigit()]
    links: dict[tuple[int, int], str] = {}
    for cells in lines:
        name = cells[0] if cells else ""
        if cells is header or not (name.startswith("GPU") and name[3:].isdigit()):
            continue
        for gpu, cell in zip(gpus, cells[1 : 1 + len(gpus)], strict=False):
            links[int(name[3:]), gpu] = cell
    return links


def nvlink_clique(links: dict[tuple[int, int], str], first: int, size: int) -> int:
    """How many GPUs from `first` on (at most `size`) are all linked by NVLink pairwise."""
    count = 1
    while count < size:
        nxt = first + count
        if not all(links.get((gpu, nxt), "").startswith("NV") for gpu in range(first, nxt)):
            break
        count += 1
    return count


def gpu_topology(evidence: Evidence) -> list[Finding]:
    config = evidence.config
    tp = config.engine.tensor_parallel_size
    if config.hardware.device is not Device.GPU or tp < 2 or evidence.env.gpu_topology is None:
        return []
    links = parse_topology(evidence.env.gpu_topology)
    gpus = sorted({a for a, _ in links})
    found = []
    # Replicas take consecutive GPUs: replica k holds GPUs k*tp .. k*tp + tp - 1.
    for first in range(0, len(gpus) - tp + 1, tp):
        reach = nvlink_clique(links, first, tp)
        if reach == tp:
            continue
        bad = next(
            (a, b, links.get((a, b), "?"))
            for b in range(first + 1, first + tp)
            for a in range(first, b)
            if not links.get((a, b), "").startswith("NV")
        )
        fitting = 1 << (reach.bit_length() - 1)  # TP sizes are powers of two
        found.append(
            Finding(
                "gpu_topology",
                Severity.PROBLEM,
                f"tensor parallelism {tp} over GPU{first}-GPU{first + tp - 1} leaves the NVLink "
                "domain: every layer's all-reduce crosses PCIe or the CPU interconnect",
                evidence=f"nvidia-smi topo -m: GPU{bad[0]} <-> GPU{bad[1]} is {bad[2]}",
                fix=f"keep TP inside the NVLink domain: engine.tensor_parallel_size {tp} -> "
                f"{fitting}, and run more replicas (replicas.count) on the freed GPUs",
                knob="engine.tensor_parallel_size",
                value=str(fitting),
            )
        )
        break  # one finding: the fix is the same for every replica
    return found
