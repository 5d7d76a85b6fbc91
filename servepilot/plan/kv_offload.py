"""The CPU tier of a GPU replica's KV cache (engine.kv_offload_gib), as vLLM sizes it.

vLLM turns --kv-offloading-size into `cpu_bytes_to_use = size x 2^30` for the whole replica
(vllm/config/vllm.py) and the native backend cuts it into blocks of the GPU's block size:
`num_blocks = cpu_bytes // (bytes of one GPU block on a rank x world_size)`, world_size being
TP x PP (vllm/v1/kv_offload/cpu/spec.py). Each data-parallel engine of a server gets the
same config, so each DP rank's KV pool gets its own tier of that size.

The memory is pinned (torch.zeros(..., pin_memory=True)) when the replica starts, not as the
tier fills: it is taken from the node's host memory for as long as the replica runs.
LMCache stores its own chunks; its figure here is the same estimate from the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servepilot.core.config import KvOffloadBackend
from servepilot.core.errors import ConfigError
from servepilot.plan.hardware import Accelerator
from servepilot.plan.kv import KvCacheShape
from servepilot.plan.parallel import Parallelism

GIB = 2**30


@dataclass(frozen=True, slots=True)
class KvOffload:
    """A CPU tier as fleet.yaml asks for it."""

    size_gib: float
    """Per KV pool of a replica, over all its TP/PP ranks (--kv-offloading-size)."""
    backend: KvOffloadBackend = KvOffloadBackend.NATIVE

    @property
    def size_bytes(self) -> int:
        """What vLLM hands its connector (int() of the float it computes)."""
        return int(self.size_gib * GIB)

    def replica_bytes(self, par: Parallelism) -> int:
        """Host memory one replica pins: a tier for each of its DP pools."""
        return self.size_bytes * par.kv_pools

    def describe(self) -> str:
        return f"{self.size_gib:g} GiB, {self.backend.value} offloading"


def cpu_tier_tokens(offload: KvOffload, shape: KvCacheShape, par: Parallelism) -> int:
    """Tokens the CPU tier of one replica holds: whole GPU-sized blocks of the replica's
    bytes per block (a rank's block x TP x PP), in every DP pool."""
    replica_block_bytes = shape.bytes_per_block * par.tp * par.pp
    blocks = offload.size_bytes // replica_block_bytes
    return blocks * shape.block_size_tokens * par.kv_pools


def host_bytes_per_node(offload: KvOffload, par: Parallelism, replicas: int, nodes: int) -> int:
    """Pinned host memory on each node when the replicas are spread evenly over the nodes
    (a replica whose pipeline stages span nodes leaves each node its share)."""
    return math.ceil(offload.replica_bytes(par) * replicas / nodes)


def check_host_memory(
    offload: KvOffload, accelerator: Accelerator, par: Parallelism, replicas: int, nodes: int
) -> None:
    """Refuse a CPU tier the node's host memory cannot pin, when the catalog knows it."""
    host = accelerator.host_memory_bytes_per_node
    if host is None or replicas < 1:
        return
    pinned = host_bytes_per_node(offload, par, replicas, nodes)
    if pinned <= host:
        return
    per_node = replicas / nodes
    raise ConfigError(
        f"engine.kv_offload_gib {offload.size_gib:g}: {per_node:g} replica(s) per node pin "
        f"{pinned / GIB:,.1f} GiB of host memory at startup, more than the "
        f"{host / GIB:,.1f} GiB a {accelerator.name} node has "
        "(host_memory_bytes_per_node in the accelerator catalog)",
        hint="lower engine.kv_offload_gib, or run fewer replicas per node",
    )
