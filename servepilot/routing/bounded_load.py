"""Bounded load: the line above which an affinity policy stops sending to its favourite replica.

Affinity (a shared prefix, a session) concentrates traffic; bounding each replica's load
relative to the mean keeps one popular prefix or one chatty session from making a hotspot, as
in consistent hashing with bounded loads.
"""

from __future__ import annotations

from collections.abc import Sequence

from servepilot.routing.base import ReplicaView


def replica_load(view: ReplicaView) -> int:
    """Requests in flight plus queued: the first key of `least_load.load_key`."""
    return view.in_flight + view.num_requests_waiting


def load_bound(candidates: Sequence[ReplicaView], epsilon: float) -> float:
    """The highest load a replica may have and still be preferred by affinity.

    (1 + epsilon) x the candidates' mean load, plus one request: without the additive term an
    idle fleet (mean 0) would make the bound 0, and the first request in flight on a replica
    would already push its affinity away, so affinity would never hold under light load.
    """
    mean = sum(replica_load(view) for view in candidates) / len(candidates)
    return (1.0 + epsilon) * mean + 1.0
