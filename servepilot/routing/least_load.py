"""Least load by power-of-two choices: sample two candidates, send to the less loaded one."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TypeVar

from mypy_extensions import mypyc_attr

from servepilot.routing.base import ReplicaView, RequestView, StatelessPolicy

T = TypeVar("T")


def load_key(view: ReplicaView) -> tuple[int, float, int]:
    """Order replicas by load: in-flight plus queued, then KV cache use, then in-flight."""
    return (view.in_flight + view.num_requests_waiting, view.kv_cache_usage, view.in_flight)


@mypyc_attr(allow_interpreted_subclasses=True)
class LeastLoad(StatelessPolicy):
    """Power-of-two choices over `load_key`.

    Sampling two instead of scanning all keeps every gateway (and every simulated one) from
    herding onto the single least-loaded replica between two state refreshes. The RNG is
    injected so the simulator and the tests get reproducible decisions.
    """

    name = "least_load"

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        if len(candidates) == 1:
            return candidates[0].replica_id
        # With exactly two candidates this compares both, in a random order, so that a full
        # tie does not always favour the first one listed.
        first, second = sample_two(self._rng, candidates)
        # load_key(second) < load_key(first), without building the tuples. Tuples compare
        # items by identity first, then ==, which only matters for one NaN object.
        a = second.in_flight + second.num_requests_waiting
        b = first.in_flight + first.num_requests_waiting
        kv_a, kv_b = second.kv_cache_usage, first.kv_cache_usage
        if a != b:
            pick_second = a < b
        elif kv_a is not kv_b and kv_a != kv_b:
            pick_second = kv_a < kv_b
        else:
            pick_second = second.in_flight < first.in_flight
        return (second if pick_second else first).replica_id


_SMALL = 21
"""random.sample's `setsize` for k = 2: up to this many, it picks from a shrinking copy."""


def sample_two(rng: random.Random, population: Sequence[T]) -> tuple[T, T]:
    """`rng.sample(population, 2)`: the same two, from the same draws of the same stream.

    The routing hot path of a simulated fleet calls this millions of times; random.sample's
    generality (type checks, a result list, a pool copy, a call per draw) is most of its
    cost. This follows CPython's code for k = 2 (3.11-3.13); tests pin it to random.sample.
    """
    n = len(population)
    if n < 2:
        raise ValueError("sample larger than population")
    if type(rng)._randbelow is not _RANDBELOW:  # type: ignore[attr-defined]
        return _sample_two_with(rng._randbelow, population, n)  # type: ignore[attr-defined]
    # Random._randbelow_with_getrandbits, inlined: k random bits until one is below the bound.
    bits = rng.getrandbits
    k = n.bit_length()
    i = bits(k)
    while i >= n:
        i = bits(k)
    if n <= _SMALL:  # the second comes from the copy, whose slot i now holds its last item
        m = n - 1
        k = m.bit_length()
        j = bits(k)
        while j >= m:
            j = bits(k)
        return population[i], population[m if j == i else j]
    j = i
    while j == i:
        j = bits(k)
        while j >= n:
            j = bits(k)
    return population[i], population[j]


def _sample_two_with(below: Callable[[int], int], population: Sequence[T], n: int) -> tuple[T, T]:
    """As `sample_two`, for a generator with its own `_randbelow` (a subclass's)."""
    i = below(n)
    if n <= _SMALL:
        j = below(n - 1)
        return population[i], population[n - 1 if j == i else j]
    j = below(n)
    while j == i:
        j = below(n)
    return population[i], population[j]


_RANDBELOW = random.Random._randbelow  # type: ignore[attr-defined]
