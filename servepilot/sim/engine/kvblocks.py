"""vLLM's KV block pool with prefix caching, counted in runs of blocks instead of blocks.

vLLM (v1/core/block_pool.py) keeps one free queue: freed blocks without a hash go to its
front (reused first), freed full blocks keep their hash and go to its back, and allocation
takes from the front, evicting the hash of a cached block it takes (LRU). A request frees
its blocks last-first, so the tail of a sequence is evicted before its head, and a cached
prefix shrinks from the end and stays a prefix.

That lets a run of blocks stand for many: a `Segment` is `count` consecutive cached blocks
of one owner in the queue, evicted from the top. Owners are a prefix group (blocks
[0, run) of the shared prefix), a preempted request (its own full blocks, which its
recomputation can hit), or nobody (cached blocks no lookup can reach any more: the unique
blocks of a finished request). Blocks without a hash are just a count. Every operation is
O(1) amortized, whatever the number of blocks.

Modelling choice (where this differs from vLLM's per-block bookkeeping): a request that
computes prefix blocks another request cached meanwhile (two long prompts of a new group
prefilling side by side) keeps its copies as its own unreachable blocks; in vLLM both copies
are findable. The group's chain only grows from its end.

KV events (vLLM's BlockStored / BlockRemoved): with `events` set to a list, the pool notes
each change of a group's chain as `(group key, first block, end block, stored)`. Only the
chains are noted: they are the blocks another request's lookup can reach; a request's own
blocks are never looked up by anyone else (chainevents.py turns the notes into the records
the gateway's index applies).
"""

from __future__ import annotations

from collections import deque
from typing import Final

from servepilot.sim.engine.request import SimRequest


class Segment:
    """`count` cached blocks in the free queue, of one owner (None: unreachable)."""

    __slots__ = ("count", "owner")

    def __init__(self, count: int, owner: Group | SimRequest | None) -> None:
        self.count = count
        self.owner = owner


class Group:
    """A prefix group's chain of cached blocks [0, run). [0, ref_top) are in use: ref_top
    is the most blocks any current user holds. The rest sit in the free queue as segments,
    oldest (the top of the chain, evicted first) to newest (the bottom, touched first)."""

    __slots__ = ("holders", "key", "ref_top", "run", "segments", "users")

    def __init__(self, key: int) -> None:
        self.key = key
        self.run = 0
        self.ref_top = 0
        self.users = 0
        self.holders: dict[int, int] = {}
        """Users by the number of group blocks they hold."""
        self.segments: deque[Segment] = deque()

    def hold(self, blocks: int) -> None:
        self.holders[blocks] = self.holders.get(blocks, 0) + 1

    def unhold(self, blocks: int) -> None:
        left = self.holders[blocks] - 1
        if left:
            self.holders[blocks] = left
        else:
            del self.holders[blocks]


_COMPACT_AT: Final = 4096
ChainNote = tuple[int, int, int, bool]
"""A KV event of a prefix chain: (group key, first block, end block, stored else evicted)."""


class BlockPool:
    """Free and cached KV blocks of one replica. Callers check `free` before `take`."""

    def __init__(self, num_blocks: int, block_size: int, *, caching: bool) -> None:
        self.block_size = block_size
        self.caching = caching
        self.usable = num_blocks - 1
        """vLLM keeps one block aside (the null block)."""
        self.free_uncached = self.usable
        self.evictable = 0
        """Cached blocks no running request uses: free, but a lookup can still hit them."""
        self._queue: deque[Segment] = deque()
        self._groups: dict[int, Group] = {}
        self._compact_at = _COMPACT_AT
        self.events: list[ChainNote] | None = None
        """Chain changes since the last look, when someone listens (see the docstring)."""

    @property
    def free(self) -> int:
        return self.free_uncached + self.evictable

    # ---- allocation ----------------------------------------------------------------------

    def take(self, count: int) -> None:
        """Allocate `count` blocks: unhashed free ones first, then evict the LRU cached."""
        uncached = self.free_uncached
        if count <= uncached:
            self.free_uncached = uncached - count
            return
        self.free_uncached = 0
        count -= uncached
        self.evictable -= count
        head = self._queue[0]
        if head.count > count and head.owner is None:
            head.count -= count  # the common case: old unique blocks of finished requests
            return
        self._evict(count)

    def _evict(self, count: int) -> None:
        queue = self._queue
        while count:
            segment = queue[0]
            taken = min(segment.count, count)
            segment.count -= taken
            count -= taken
            owner = segment.owner
            if isinstance(owner, Group):
                run = owner.run
                owner.run = run - taken
                events = self.events
                if events is not None and taken:
                    events.append((owner.key, run - taken, run, False))
            if segment.count:
                return
            # Emptied now, or a husk already empty (its blocks were touched again).
            queue.popleft()
            if isinstance(owner, Group):
                # A group's segments reach the front oldest first: this is its top one.
                owner.segments.popleft()
                self._forget_if_empty(owner)
            elif owner is not None:
                owner._own_segment = None

    # ---- prefix cache --------------------------------------------------------------------

    def lookup(self, request: SimRequest) -> tuple[int, int]:
        """(blocks hit, how many of those sit in the free queue) for `request` about to be
        admitted. As vLLM, the last token is always computed: hits stop before it."""
        cap = (request._num_tokens - 1) // self.block_size
        hit = evictable = 0
        prefix = request._prefix_blocks
        if prefix:
            group = self._groups.get(_key(request))
            if group is not None:
                hit = min(group.run, prefix, cap)
                evictable = max(0, hit - group.ref_top)
            if hit < prefix:
                return hit, evictable
        own = request._own_segment
        if own is not None and hit < cap:
            own_hit = min(own.count, cap - hit)
            return hit + own_hit, evictable + own_hit
        return hit, evictable

    def touch(self, request: SimRequest, hit: int) -> None:
        """Admit `request` with `hit` blocks from the cache (from `lookup`): they come out
        of the free queue, and the request joins its group."""
        prefix = request._prefix_blocks
        group_hit = min(hit, prefix)
        if prefix:
            key = _key(request)
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = Group(key)
            group.users += 1
            group.hold(group_hit)
            if group_hit > group.ref_top:
                self._touch_group(group, group_hit - group.ref_top)
                group.ref_top = group_hit
        request._group_held = group_hit
        own = request._own_segment
        if own is not None:
            taken = hit - group_hit
            own.count -= taken
            self.evictable -= taken
            # What is left of its old blocks stays cached, but its recomputation writes new
            # ones: no lookup reaches the old ones again.
            own.owner = None
            request._own_segment = None

    def _touch_group(self, group: Group, count: int) -> None:
        """Take `count` blocks off the bottom of the group's evictable run."""
        self.evictable -= count
        segments = group.segments
        while count:
            segment = segments[-1]
            taken = min(segment.count, count)
            segment.count -= taken
            count -= taken
            if not segment.count:
                segments.pop()
                segment.owner = None  # an empty husk in the queue, dropped when reached

    def register(self, request: SimRequest, computed_tokens: int) -> None:
        """`request` has computed (or is computing) `computed_tokens`: prefix blocks past
        the end of its group's chain become the group's, when they continue the chain."""
        prefix = request._prefix_blocks
        held = request._group_held
        if held >= prefix:
            return
        group = self._groups[_key(request)]
        reached = min(prefix, computed_tokens // self.block_size)
        if reached > group.run and held == group.run:
            events = self.events
            if events is not None:
                events.append((group.key, held, reached, True))
            group.unhold(held)
            group.hold(reached)
            group.run = group.ref_top = reached
            request._group_held = reached

    # ---- release -------------------------------------------------------------------------

    def release(
        self,
        request: SimRequest,
        kv_tokens: int,
        *,
        keep_own: bool,
        cached_tokens: int | None = None,
    ) -> None:
        """`request` frees its blocks (holding `kv_tokens` tokens). Its full blocks stay cached
        (those within its first `cached_tokens` tokens, when given); with `keep_own` (a
        preemption) its own ones stay findable by its recomputation."""
        size = self.block_size
        held = -(-kv_tokens // size)
        full = (kv_tokens if cached_tokens is None else cached_tokens) // size
        if not self.caching:
            self.free_uncached += held
            return
        self.free_uncached += held - full
        prefix = request._prefix_blocks
        if not prefix and not keep_own:
            # The common case: unique blocks of a finished request, never looked up again.
            self.evictable += full
            queue = self._queue
            if queue and queue[-1].owner is None:
                queue[-1].count += full
            elif full:
                self._append(Segment(full, None))
            return
        group_held = request._group_held
        own = full - group_held
        if own > 0:
            # Its own blocks continue the group's chain only if it held the whole prefix.
            self._push_own(request, own, keep_own and group_held == prefix)
        request._group_held = 0
        if prefix:
            self._leave_group(self._groups[_key(request)], group_held)

    def _push_own(self, request: SimRequest, count: int, keep: bool) -> None:
        self.evictable += count
        queue = self._queue
        if keep:
            segment = Segment(count, request)
            request._own_segment = segment
            self._append(segment)
        elif queue and queue[-1].owner is None:
            queue[-1].count += count
        else:
            self._append(Segment(count, None))

    def _leave_group(self, group: Group, held: int) -> None:
        """A user holding `held` group blocks leaves: the blocks no other user holds become
        evictable, as the newest (bottom) segment of the group."""
        group.users -= 1
        group.unhold(held)
        if held < group.ref_top or held in group.holders:
            return
        top = max(group.holders) if group.holders else 0
        freed = group.ref_top - top
        group.ref_top = top
        if freed:
            self.evictable += freed
            segment = Segment(freed, group)
            group.segments.append(segment)
            self._append(segment)
        self._forget_if_empty(group)

    def _append(self, segment: Segment) -> None:
        queue = self._queue
        queue.append(segment)
        if len(queue) > self._compact_at:
            # Drop the empty husks; amortized O(1) per append.
            self._queue = deque(s for s in queue if s.count)
            self._compact_at = max(_COMPACT_AT, 2 * len(self._queue))

    def _forget_if_empty(self, group: Group) -> None:
        if not group.run and not group.users and self._groups.get(group.key) is group:
            del self._groups[group.key]

    # ---- checks --------------------------------------------------------------------------

    def check(self, own_in_use: int) -> None:
        """Assert the books balance, given the blocks running requests hold as their own."""
        groups_in_use = sum(g.ref_top for g in self._groups.values())
        queued = sum(s.count for s in self._queue)
        assert queued == self.evictable, (queued, self.evictable)
        assert self.free_uncached >= 0 and self.evictable >= 0
        total = self.free_uncached + self.evictable + own_in_use + groups_in_use
        assert total == self.usable, (total, self.usable)
        for group in self._groups.values():
            on_queue = sum(segment.count for segment in group.segments)
            assert group.run == group.ref_top + on_queue, (group.key, group.run)
            assert all(segment.count for segment in group.segments)
            assert group.users == sum(group.holders.values())
            assert group.ref_top == max(group.holders, default=0), (group.key, group.ref_top)


def _key(request: SimRequest) -> int:
    key = request.prefix_group
    assert key is not None, "only requests with a prefix group have prefix blocks"
    return key
