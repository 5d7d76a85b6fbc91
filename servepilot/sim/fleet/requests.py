"""Turning a client's slot into a request at the gateway, with what routing sees of it.

Prefix-aware policies need `RequestView.prefix_hashes`, chained hashes of the prompt text's
leading blocks of `routing.prefix_block_chars` characters (`routing.prefix`). The simulator
has token counts, not text, so it stands in for them: a prompt of T tokens is T x
`chars_per_token` characters; the blocks inside a job's shared prefix get hashes of (group,
block index), the same for every job of the group, and the blocks after it hashes of their
own. Equal hashes where the text would be equal is all a policy can tell apart.

With the replicas' KV events on (sim/fleet/kvevents.py), `RequestView.kv_block_hashes` holds
the keys of the prompt's reusable blocks at the engine's block size, as the gateway's
tokeniser would give them for the exact index.
"""

from __future__ import annotations

from typing import Final

from servepilot.core.config import RoutingConfig
from servepilot.load.slots import Slot
from servepilot.routing.admission import SHARED_TENANT
from servepilot.routing.base import RequestView
from servepilot.sim.fleet.kvevents import prompt_keys
from servepilot.sim.fleet.liveview import REQUEST_VIEW_SETTERS
from servepilot.sim.fleet.members import FleetRequest
from servepilot.sim.fleet.traffic import JobTable

# Hashes of blocks no other request shares: counted up from here, far from any tuple hash
# (which are spread over the whole 64-bit range) in practice.
_UNIQUE_BASE: Final = 1 << 62
_SET: Final = REQUEST_VIEW_SETTERS
_new: Final = object.__new__


class RequestFactory:
    def __init__(
        self,
        jobs: JobTable,
        routing: RoutingConfig,
        model: str,
        uses_prefix: bool,
        kv_block_size: int | None = None,
    ) -> None:
        """`kv_block_size`: the engine's, when the exact index is kept (None: it is not)."""
        self._jobs = jobs
        self._model = model
        self._cpt = routing.chars_per_token
        self._block_chars = routing.prefix_block_chars
        self._max_blocks = routing.prefix_max_blocks
        self._uses_prefix = uses_prefix
        self._kv_block_size = kv_block_size or 0
        self._groups: dict[int, tuple[int, ...]] = {}
        self._next_id = 0
        self._next_unique = _UNIQUE_BASE

    def make(self, slot: Slot, now_s: float) -> FleetRequest:
        """The request of `slot`, reaching the gateway at `now_s`."""
        jobs, index = self._jobs, slot.request
        request_id = self._next_id
        self._next_id = request_id + 1
        group = jobs.group[index]
        prefix = jobs.prefix[index]
        priority = jobs.priority[index]
        routed = jobs.routed[index]
        request = FleetRequest(
            request_id, jobs.prompt[index], jobs.output[index], slot.send_s,
            None if group < 0 else group, prefix, priority,
        )  # fmt: skip
        request.warmup = slot.warmup
        tenants = jobs.tenants
        if tenants is not None:
            request.tenant = tenants[index] or SHARED_TENANT
        sessions = jobs.sessions
        request.view = view = new_request_view(
            self._model,
            int(routed * self._cpt),
            routed,
            self._hashes(routed, group, prefix) if self._uses_prefix else (),
            None if sessions is None else sessions[index],
            priority,
            now_s,
        )
        block_size = self._kv_block_size
        if block_size and group >= 0:
            keys = prompt_keys(group, prefix, jobs.prompt[index], block_size)
            _SET[7](view, keys)
        return request

    def _hashes(self, routed_tokens: int, group: int, prefix_tokens: int) -> tuple[int, ...]:
        cpt, size = self._cpt, self._block_chars
        blocks = min(int(routed_tokens * cpt) // size, self._max_blocks)
        shared = 0
        head: tuple[int, ...] = ()
        if group >= 0:
            shared = min(blocks, int(prefix_tokens * cpt) // size)
            head = self._group_hashes(group)[:shared]
        start = self._next_unique
        self._next_unique = start + blocks - shared
        return head + tuple(range(start, start + blocks - shared))

    def _group_hashes(self, group: int) -> tuple[int, ...]:
        known = self._groups.get(group)
        if known is None:
            known = self._groups[group] = tuple(
                hash((group, block)) for block in range(self._max_blocks)
            )
        return known


def new_request_view(
    model: str,
    prompt_chars: int,
    prompt_tokens: int,
    prefix_hashes: tuple[int, ...],
    session_id: str | None,
    priority: int,
    arrival_s: float,
) -> RequestView:
    """`RequestView(...)` with every field given, for a third of the cost (liveview.py)."""
    view: RequestView = _new(RequestView)
    _SET[0](view, model)
    _SET[1](view, prompt_chars)
    _SET[2](view, prompt_tokens)
    _SET[3](view, prefix_hashes)
    _SET[4](view, session_id)
    _SET[5](view, priority)
    _SET[6](view, arrival_s)
    _SET[7](view, ())  # no exact index: the simulated gateway does not tokenise
    return view
