"""In which order a local fleet's replicas start when several share a GPU
(hardware.replicas_per_gpu > 1).

vLLM sizes a replica's KV cache at startup from the device memory it profiles (the free
memory it reads, what its own weights and activations take): two replicas profiling one GPU
at once each see the other's allocations come and go, and one can refuse to start or size
its cache from a wrong number. So the first replica of every GPU group starts at once, and
each further replica of a group only once the one before it on that group is ready. A pure
function; fleet/local.py does the starting.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StartStep:
    replica_id: str
    group: int
    """The GPU group (DeviceAssignment.group_of) the replica runs on."""
    after: str | None
    """The replica on the same group it starts after (once that one is ready); None: at once."""
    wave: int
    """0 for a replica that starts at once, 1 for one that waits for a wave-0 replica, ..."""


def start_steps(
    slots: Sequence[tuple[str, int]],
    replicas_per_gpu: int,
    starting: Sequence[tuple[str, int]] = (),
) -> tuple[StartStep, ...]:
    """How each of `slots` ((replica id, replica slot), in launch order) starts.
    `starting`: replicas launched earlier and not ready yet, as (id, slot): a new replica on
    one of their groups waits for the last of them."""
    last: dict[int, tuple[str, int]] = {}
    for rid, slot in starting:
        last[slot // replicas_per_gpu] = (rid, 0)
    steps = []
    for rid, slot in slots:
        group = slot // replicas_per_gpu
        before = last.get(group)
        wave = 0 if before is None else before[1] + 1
        steps.append(StartStep(rid, group, None if before is None else before[0], wave))
        last[group] = (rid, wave)
    return tuple(steps)


def waves(steps: Sequence[StartStep]) -> tuple[tuple[str, ...], ...]:
    """The replica ids of each wave, wave 0 first."""
    count = max((s.wave for s in steps), default=-1) + 1
    return tuple(tuple(s.replica_id for s in steps if s.wave == w) for w in range(count))
