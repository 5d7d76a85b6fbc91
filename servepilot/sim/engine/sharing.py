"""What a decode step's decoders read of the prefixes they share (pure; no I/O).

Decode attention is bound by reading KV, and a block the whole batch reads comes from memory
once, so a step pays for a shared prefix once, not once per decoder (on vLLM-CPU, shared
prefixes of 230-670 tokens had their TPOT over-predicted by 15-20% when each decoder paid for
its own copy: docs/benchmarks.md). With prefix caching, decoders of one prefix group hold the
group's blocks; `reread` is the prefix tokens a step would read more than once: per group,
its decoders' prefix tokens less their mean. Kept as decoders start and stop, O(1) each.
"""

from __future__ import annotations

from collections.abc import Iterable

from servepilot.sim.engine.request import SimRequest


class SharedPrefixReads:
    def __init__(self, block_size: int) -> None:
        self._bs = block_size
        self.groups: dict[int, list[int]] = {}
        """Prefix group -> [its decoders, their prefix blocks' tokens]."""
        self.reread = 0

    def join(self, request: SimRequest) -> None:
        """A decoder with prefix blocks starts reading them."""
        self._change(request, 1)

    def leave(self, request: SimRequest) -> None:
        self._change(request, -1)

    def _change(self, request: SimRequest, sign: int) -> None:
        group = request.prefix_group
        assert group is not None
        entry = self.groups.get(group)
        if entry is None:
            entry = self.groups[group] = [0, 0]
        readers, tokens = entry
        if readers:
            self.reread -= tokens - tokens // readers
        readers += sign
        tokens += sign * request._prefix_blocks * self._bs
        if readers:
            entry[0] = readers
            entry[1] = tokens
            self.reread += tokens - tokens // readers
        else:
            del self.groups[group]

    def check(self, decoders: Iterable[SimRequest]) -> None:
        """Assert the books match `decoders` (every decoder with prefix blocks; tests)."""
        groups: dict[int, list[int]] = {}
        for request in decoders:
            assert request.prefix_group is not None
            entry = groups.setdefault(request.prefix_group, [0, 0])
            entry[0] += 1
            entry[1] += request._prefix_blocks * self._bs
        assert groups == self.groups, (groups, self.groups)
        reread = sum(tokens - tokens // readers for readers, tokens in groups.values())
        assert reread == self.reread, (reread, self.reread)
