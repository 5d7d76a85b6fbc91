"""What a soak samples besides the target's /metrics when the target is a servepilot fleet
running on this machine: every process of every replica (from the fleet record's pids) and,
on GPUs, the memory used on each device (the node's GPU reader)."""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from servepilot.engine.gpu.inventory import GpuProbe
from servepilot.engine.gpu.probe import NodeProbe
from servepilot.engine.process_memory import replica_memory
from servepilot.fleet.state import FleetRecord, read_records

_LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}


def local_fleet(url: str, records: list[FleetRecord] | None = None) -> FleetRecord | None:
    """The fleet whose gateway serves `url` on this machine, if `up` runs one there."""
    parts = urlsplit(url)
    if parts.hostname not in _LOCAL_HOSTS:
        return None
    found = read_records() if records is None else records
    return next((r for r in found if r.port == parts.port), None)


def fleet_memory_sampler(
    record: FleetRecord, gpus: GpuProbe | None = None
) -> Callable[[], dict[str, int]]:
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
