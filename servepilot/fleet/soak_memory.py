"""What a soak samples besides the target's /metrics when the target is a servepilot fleet
running on this machine: every process of every replica (from the fleet record's pids) and,
on GPUs, the memory used on each device (the node's GPU reader). `bench --soak` and `accept`
find their sources here, so both read the same memory of the same fleet."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from servepilot.engine.gpu.inventory import GpuInventory, GpuProbe
from servepilot.engine.gpu.probe import NodeProbe
from servepilot.engine.process_memory import replica_memory
from servepilot.fleet.state import FleetRecord, read_records

_LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}

MemorySampler = Callable[[], dict[str, int]]
"""Bytes by source name, read now (it may block: a soak runs it in a thread)."""


@dataclass(frozen=True, slots=True)
class SoakMemory:
    sampler: MemorySampler | None
    """None where only the target's /metrics can be read."""
    described: str
    """What the soak will read, in words for the user."""


class _NoGpus:
    """A host whose GPUs were looked for once and not found: not asked again every window."""

    def read(self) -> GpuInventory:
        return GpuInventory()


def soak_memory(
    url: str, records: Sequence[FleetRecord] | None = None, gpus: GpuProbe | None = None
) -> SoakMemory:
    """The memory a soak of `url` reads besides its /metrics: the processes of a fleet `up`
    runs on this machine, and this node's GPUs where it has any."""
    record = local_fleet(url, list(records) if records is not None else None)
    if record is None:
        return SoakMemory(
            None,
            "soak memory: the target's /metrics only (each replica process, and each GPU, "
            "only for a servepilot fleet running on this machine)",
        )
    probe = gpus if gpus is not None else NodeProbe()
    found = probe.read().count
    replicas = len(record.replicas)
    said = (
        f"soak memory: the target's /metrics and each process of its {replicas} "
        f"replica{'' if replicas == 1 else 's'}"
    )
    if found:
        said += ", and the GPU" if found == 1 else f", and each of the {found} GPUs"
    return SoakMemory(fleet_memory_sampler(record, probe if found else _NoGpus()), said)


def local_fleet(url: str, records: list[FleetRecord] | None = None) -> FleetRecord | None:
    """The fleet whose gateway serves `url` on this machine, if `up` runs one there."""
    parts = urlsplit(url)
    if parts.hostname not in _LOCAL_HOSTS:
        return None
    found = read_records() if records is None else records
    return next((r for r in found if r.port == parts.port), None)


def fleet_memory_sampler(record: FleetRecord, gpus: GpuProbe | None = None) -> MemorySampler:
    """Sample `record`'s replicas' processes (their memory by process) and each GPU's used
    memory (`gpu0`, ...; none where no GPU is readable)."""
    probe = gpus if gpus is not None else NodeProbe()
    roots = {r.replica_id: r.pid for r in record.replicas if r.pid > 0}

    def sample() -> dict[str, int]:
        memory = replica_memory(roots)
        for device in probe.read().devices:
            memory[f"gpu{device.index}"] = device.memory_used_bytes
        return memory

    return sample
