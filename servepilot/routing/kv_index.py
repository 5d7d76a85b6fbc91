"""The exact index of the KV blocks each replica holds, kept from vLLM's own KV events.

What routing calls (pure, no I/O; the same objects run in the gateway and the simulator):

    hashes = prompt_block_hashes(token_ids, hashing)   # once per request
    index.cached_prefix_tokens(replica_id, hashes) -> int   # prompt tokens vLLM would reuse
    index.is_exact(replica_id) -> bool                       # else fall back to a guess

What the edge that reads the events (`gateway.kv_events`) calls:

    index.apply(replica_id, seq, events) -> Applied   # OK, a duplicate, a gap, or a restart
    index.attach(replica_id) / index.detach(replica_id, why)
    index.resync(replica_id, seq)   # a gap replay could not fill: start again from `seq`
    index.forget(replica_id)        # the replica left the pool

Block hashes are computed as vLLM 0.32 computes them (`vllm.v1.core.kv_cache_utils`
`hash_block_tokens` with `vllm.utils.hashing.sha256`, its default `--prefix-caching-hash-algo`):
block i's hash is sha256(pickle((parent, tuple(block_tokens), None))) with the parent of block 0
being NONE_HASH = sha256(pickle(seed)); the seed is the replica's PYTHONHASHSEED when set, else
the fixed "vllm-none-hash". The events carry the low 64 bits of each digest as an int (vLLM's
default VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1), or the digest's bytes; both index alike.
"""

from __future__ import annotations

import enum
import hashlib
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import cast

DEFAULT_SEED = "vllm-none-hash"
"""vLLM's NONE_HASH seed when PYTHONHASHSEED is not set (cryptographic hash algorithms)."""
SUPPORTED_ALGOS = ("sha256",)
_LOW_64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class BlockHashing:
    """How one replica hashes its blocks: both sides must agree, or no block ever matches."""

    block_size: int
    """Tokens per block (vLLM's `--block-size`: 128 on CPU, 16 on most GPUs by default)."""
    seed: str = DEFAULT_SEED
    """NONE_HASH's seed: the replica's PYTHONHASHSEED if it has one."""
    algo: str = "sha256"

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be positive, not {self.block_size}")
        if self.algo not in SUPPORTED_ALGOS:
            raise ValueError(f"hash algorithm {self.algo!r} is not one of {SUPPORTED_ALGOS}")


def _sha256(value: object) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def external_hash(value: bytes | int) -> int:
    """A block hash as the index keys it: the low 64 bits of vLLM's digest."""
    if isinstance(value, int):
        return value & _LOW_64
    return int.from_bytes(value, "big") & _LOW_64


def _keys(hashes: Sequence[bytes | int]) -> Iterable[int]:
    """`external_hash` of each of a batch's hashes, all ints or all digests (as one publisher
    or one tokeniser gives them): ints already in range as they are, other ints masked, with
    no Python call per hash (a batch can hold thousands)."""
    if hashes and isinstance(hashes[0], int):
        ints = cast(Sequence[int], hashes)
        if min(ints) >= 0 and max(ints) <= _LOW_64:
            return ints
        return map(_LOW_64.__and__, ints)
    return map(external_hash, hashes)


def prompt_block_hashes(
    token_ids: Sequence[int], hashing: BlockHashing, *, parent: bytes | None = None
) -> list[bytes]:
    """The digests of the prompt's blocks that vLLM could reuse, in order.

    vLLM reuses at most all but the last prompt token (it must compute one to sample), so
    only the full blocks of `token_ids[:-1]` are hashed. `parent` continues a chain: the
    digest of the block before `token_ids[0]` (None: the prompt starts here).
    """
    usable = max(0, (len(token_ids) - 1) // hashing.block_size * hashing.block_size)
    first = parent if parent is not None else root_hash(hashing)
    return chained_hashes(token_ids[:usable], hashing, first)


def root_hash(hashing: BlockHashing) -> bytes:
    """The parent of a prompt's first block (vLLM's NONE_HASH)."""
    return _sha256(hashing.seed)


def chained_hashes(token_ids: Sequence[int], hashing: BlockHashing, parent: bytes) -> list[bytes]:
    """The digest of each full block of `token_ids`, chained from `parent`."""
    size = hashing.block_size
    digests: list[bytes] = []
    for start in range(0, len(token_ids) // size * size, size):
        parent = _sha256((parent, tuple(token_ids[start : start + size]), None))
        digests.append(parent)
    return digests


# --- events (vLLM's distributed/kv_events.py, as plain records) ------------------------------


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared
GPU_MEDIUM = "GPU"
"""vLLM's tier for the blocks it computes in: on CPU builds too. Offloaded tiers (CPU, disk)
are not what a prefill reuses without a copy, so they are not indexed."""


class Applied(enum.Enum):
    OK = "ok"
    DUPLICATE = "duplicate"
    """Already applied (a replay overlapping the live stream): ignored."""
    GAP = "gap"
    """Batches were missed: not applied; replay from `expected_seq` or resync."""
    RESTARTED = "restarted"
    """The publisher started counting again (the replica restarted): its blocks were
    forgotten, then the batch applied."""


@dataclass(slots=True)
class _Replica:
    blocks: set[int] = field(default_factory=set)
    last_seq: int = -1
    block_size: int | None = None
    attached: bool = False
    why_not: str = "no KV events received yet"


class KvIndex:
    """Per replica: the set of block hashes its GPU tier holds, and whether the set is exact."""

    def __init__(self, hashing: BlockHashing) -> None:
        self.hashing = hashing
        self._replicas: dict[str, _Replica] = {}

    # --- what routing asks ---------------------------------------------------------------

    def is_exact(self, replica_id: str) -> bool:
        """True while the replica's events flow in order and its blocks hash like ours."""
        replica = self._replicas.get(replica_id)
        return replica is not None and replica.attached

    def exact_replicas(self) -> list[str]:
        """The replicas whose events flow."""
        return [rid for rid, replica in self._replicas.items() if replica.attached]

    def cached_prefix_tokens(self, replica_id: str, block_hashes: Sequence[int | bytes]) -> int:
        """Prompt tokens the replica holds as a cached prefix: whole leading blocks, stopping
        at the first one it lacks (vLLM's own lookup); 0 for a replica that is not exact."""
        replica = self._replicas.get(replica_id)
        if replica is None or not replica.attached:
            return 0
        blocks = replica.blocks
        if not block_hashes or external_hash(block_hashes[0]) not in blocks:
            return 0  # most replicas, for most prompts: no walk set up
        held = len(list(takewhile(blocks.__contains__, _keys(block_hashes))))
        return held * self.hashing.block_size

    def why_not_exact(self, replica_id: str) -> str | None:
        """Why the replica's prefix is guessed rather than known; None when it is exact."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return "no KV event subscription"
        return None if replica.attached else replica.why_not

    def blocks_held(self, replica_id: str) -> int:
        replica = self._replicas.get(replica_id)
        return 0 if replica is None else len(replica.blocks)

    def expected_seq(self, replica_id: str) -> int:
        """The sequence number the next batch from the replica should carry."""
        replica = self._replicas.get(replica_id)
        return 0 if replica is None else replica.last_seq + 1

    # --- what the event edge tells ---------------------------------------------------------

    def attach(self, replica_id: str) -> None:
        """Its publisher answers: its events are the truth from now on."""
        replica = self._replicas.setdefault(replica_id, _Replica())
        if replica.block_size in (None, self.hashing.block_size):
            replica.attached = True

    def detach(self, replica_id: str, why: str) -> None:
        """Events stopped flowing (or never started): routing must guess again."""
        replica = self._replicas.setdefault(replica_id, _Replica())
        replica.attached = False
        replica.why_not = why

    def resync(self, replica_id: str, seq: int) -> None:
        """Missed batches that no replay can give back: forget the replica's blocks and go on
        from batch `seq`. The index then holds fewer blocks than the replica; vLLM re-sends a
        BlockStored for every cached block a request reuses, so hot prefixes come back."""
        replica = self._replicas.setdefault(replica_id, _Replica())
        replica.blocks.clear()
        replica.last_seq = seq - 1

    def forget(self, replica_id: str) -> None:
        self._replicas.pop(replica_id, None)

    def apply(self, replica_id: str, seq: int, events: Iterable[KvEvent]) -> Applied:
        """Apply one batch of the replica's events, numbered `seq` by its publisher."""
        replica = self._replicas.setdefault(replica_id, _Replica())
        outcome = Applied.OK
        if replica.last_seq >= 0 and seq <= replica.last_seq:
            # A replay starts after the last applied batch, so only a new publisher sends 0.
            if seq != 0:
                return Applied.DUPLICATE
            replica.blocks.clear()
            outcome = Applied.RESTARTED
        elif replica.last_seq >= 0 and seq > replica.last_seq + 1:
            return Applied.GAP
        replica.last_seq = seq
        for event in events:
            self._apply_one(replica_id, replica, event)
        return outcome

    def _apply_one(self, replica_id: str, replica: _Replica, event: KvEvent) -> None:
        if isinstance(event, AllBlocksCleared):
            replica.blocks.clear()
            return
        if event.medium not in (None, GPU_MEDIUM):
            return
        if isinstance(event, BlockRemoved):
            replica.blocks.difference_update(_keys(event.block_hashes))
            return
        if event.block_size != self.hashing.block_size:
            replica.block_size = event.block_size
            self.detach(
                replica_id,
                f"its blocks hold {event.block_size} tokens, the gateway hashes "
                f"{self.hashing.block_size}",
            )
            return
        replica.block_size = event.block_size
        replica.blocks.update(_keys(event.block_hashes))
