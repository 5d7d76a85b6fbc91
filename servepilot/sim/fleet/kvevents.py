"""The replicas' KV events as the gateway's edge receives them: the exact index routing reads.

vLLM publishes the KV events of each engine step (blocks stored, blocks evicted) when the step
ends, and the gateway applies each batch, numbered by its publisher, to one `KvIndex`
(gateway/kv_events.py). Here each simulated replica's block pool notes the changes of its
prefix chains (sim/engine/kvblocks.py); a step's notes become one batch of `BlockStored` and
`BlockRemoved` records, published at the step's end, that reach the index `delay_s` later (by
default the replica's one-way hop to the gateway, `--network-ms`), applied as the gateway's
edge applies them. Routing sees a replica's cache as it was one step and one hop ago.

Block hashes: the simulator has no token ids, so block i of prefix group g is keyed by (g, i)
packed into one 64-bit int (the index keys vLLM's digests by their low 64 bits alike), which
is all a chained hash says: the same prefix up to this block. Blocks of two groups never
match. A request's `kv_block_hashes` are its group's keys for the blocks vLLM may reuse
(`prompt_block_hashes`' rule: full blocks before the last prompt token).

Not modelled: a replica's own (non-prefix) blocks are not published, since no other
request's lookup can reach them; nothing in the simulated engine clears its whole cache, so
no `AllBlocksCleared` is sent. A replica leaving the gateway is forgotten; one coming back
(woken) starts with an empty index, as vLLM's cache after a sleep.
"""

from __future__ import annotations

from typing import Final

from servepilot.routing.kv_index import BlockHashing, KvIndex
from servepilot.sim.engine.chainevents import chain_records
from servepilot.sim.engine.kvblocks import ChainNote
from servepilot.sim.fleet.members import FleetReplica, Push
from servepilot.sim.fleet.network import NetworkConfig

_BLOCK_BITS: Final = 24
_GROUP_MASK: Final = (1 << (64 - _BLOCK_BITS)) - 1


def block_key(group: int, block: int) -> int:
    """The 64-bit hash the simulator gives block `block` of prefix group `group`."""
    return ((group & _GROUP_MASK) << _BLOCK_BITS) | block


def prompt_keys(
    group: int, prefix_tokens: int, prompt_tokens: int, block_size: int
) -> tuple[int, ...]:
    """The keys of the prompt's blocks vLLM could reuse: whole blocks of the shared prefix,
    before the last prompt token (it is always computed)."""
    blocks = min(prefix_tokens, prompt_tokens - 1) // block_size
    base = block_key(group, 0)
    return tuple(range(base, base + blocks))


class GroupKeys:
    """The simulator's chains: block i of group g keyed (g, i); no token ids."""

    def block_keys(self, group: int, first: int, end: int) -> range:
        base = block_key(group, 0)
        return range(base + first, base + end)

    def block_tokens(self, group: int, first: int, end: int) -> tuple[int, ...]:
        return ()


_GROUP_KEYS: Final = GroupKeys()


class KvEventFeed:
    """Every replica's events, from its block pool to the shared index."""

    def __init__(
        self, block_size: int, push: Push, kind: int, network: NetworkConfig, delay_s: float | None
    ) -> None:
        self.index = KvIndex(BlockHashing(block_size))
        self.block_size = block_size
        self._push = push
        self._kind = kind
        self._network = network
        self._delay_s = delay_s
        self._seq: dict[str, int] = {}
        self._delays: dict[str, float] = {}
        self.batches = 0
        """Batches published (a step with chain changes publishes one)."""

    def attach(self, replica: FleetReplica) -> None:
        """The gateway subscribes to the replica's events (it joined the gateway)."""
        rid = replica.replica_id
        replica.model.listen_kv_events()
        delay = self._delay_s
        if delay is None:
            delay = self._network.replica_delay(replica.index).mean_s
        self._delays[rid] = delay
        self.index.attach(rid)

    def forget(self, replica: FleetReplica) -> None:
        """It left the gateway: its batches still on their way are dropped."""
        self.index.forget(replica.replica_id)
        self._delays.pop(replica.replica_id, None)

    def delay_s(self, replica_id: str) -> float | None:
        """From a step's end to its batch applied; None for a replica not subscribed to."""
        return self._delays.get(replica_id)

    def published(self, replica: FleetReplica, end_s: float) -> None:
        """The replica's step ending at `end_s` has run: what it stored and evicted leaves."""
        notes = replica.model.take_kv_events()
        if not notes:
            return
        rid = replica.replica_id
        delay = self._delays.get(rid)
        if delay is None:
            return
        seq = self._seq.get(rid, 0)
        self._seq[rid] = seq + 1
        self.batches += 1
        self._push(end_s + delay, self._kind, (rid, seq, notes))

    def deliver(self, batch: tuple[str, int, list[ChainNote]]) -> None:
        """A batch reaches the gateway: applied to the index with its sequence number."""
        rid, seq, notes = batch
        if rid not in self._delays:
            return
        self.index.apply(rid, seq, chain_records(notes, self.block_size, _GROUP_KEYS))
