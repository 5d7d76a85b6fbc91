"""Round robin: each replica in turn, in replica-id order."""

from __future__ import annotations

from collections.abc import Sequence

from mypy_extensions import mypyc_attr

from servepilot.routing.base import ReplicaView, RequestView, StatelessPolicy


@mypyc_attr(allow_interpreted_subclasses=True)
class RoundRobin(StatelessPolicy):
    """Picks the candidate whose id comes next after the last one chosen.

    The cursor is the last chosen *id*, not an index, so when a replica joins or leaves (or
    the last chosen one is drained) the others keep their turn instead of the rotation
    jumping: the next choice is the smallest id greater than the cursor, wrapping around.
    """

    name = "round_robin"

    def __init__(self) -> None:
        self._last_id: str | None = None

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        first = candidates[0].replica_id
        following: str | None = None
        for view in candidates:
            rid = view.replica_id
            first = min(first, rid)
            if self._last_id is not None and rid > self._last_id:
                following = rid if following is None else min(following, rid)
        chosen = first if following is None else following
        self._last_id = chosen
        return chosen
