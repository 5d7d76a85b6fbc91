"""Predicted latency: send a request where its predicted TTFT and TPOT best meet its targets.

For every candidate replica the policy predicts this request's time to first token and time
per output token from three things:

- the replica's step-time model (`StepTimeModel`: plan's cost model or a calibrated profile,
  injected per replica; routing never imports them);
- its load: the prefill work already sent to it and not yet done, and its running batch;
- the prompt tokens it already holds in its prefix cache for this request (`PrefixIndex`:
  the gateway's guess from what it sent, or an exact index fed by vLLM's KV events).

TTFT = the queue ahead + this prompt's uncached tokens prefilled in the engine's chunks
beside the running batch; TPOT = one decode step of the batch with this request in it. The
request's class (P0, P1, P2) gives its targets (`RoutingConfig.ttft_target_ms`,
`tpot_target_ms`). Replicas predicted to meet both come first; among them (or among all,
when none does) the one with the most headroom wins: the lowest sum of the predictions as
shares of their targets, so a class's tight target weighs its metric more. The prefill
counts twice in it: once as this request's wait, once as the wait it puts on the requests
that will queue behind it there. Without that second count the choice is greedy for this
one request and spreads each prefix over the fleet, recomputing what another replica holds
and pushing other prefixes out of its cache. Exact ties go to a seeded random choice.

The queue ahead is the policy's own account of the prefill work it has sent each replica
(a replica is busy with it until the predicted end of its last prefill), floored by vLLM's
scraped waiting requests at the mean prompt, so traffic the gateway did not send still
counts. The running batch is the gateway's in-flight count, always current; the context
each running sequence reads is the mean prompt routed so far.

The hard limits stay where they are: the caller offers only replicas under their
concurrency budget, below the KV-full line and with a closed breaker.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from servepilot.core.config import RoutingConfig
from servepilot.routing.base import ReplicaView, RequestView
from servepilot.routing.kv_index import KvIndex
from servepilot.routing.prefix_table import GuessedPrefixIndex

_MEAN_WEIGHT = 1.0 / 64
"""Weight of each routed prompt in the running mean prompt (about the last 64 requests)."""


class StepTimeModel(Protocol):
    """How long a replica's engine takes to prefill a prompt and to take one decode step."""

    def prefill_s(
        self, new_tokens: int, cached_tokens: int, decode_seqs: int, context_tokens: int
    ) -> float:
        """Seconds from a prompt's first scheduled step to its first token: `new_tokens`
        computed after `cached_tokens` already in KV, in the engine's chunks, each step also
        decoding `decode_seqs` sequences that read `context_tokens` KV tokens in all."""
        ...

    def decode_step_s(self, decode_seqs: int, context_tokens: int) -> float:
        """Seconds of one step decoding `decode_seqs` sequences over `context_tokens`."""
        ...


class PrefixIndex(Protocol):
    """Where a request's prompt is already cached."""

    def cached_tokens(self, request: RequestView) -> Mapping[str, int]:
        """Leading prompt tokens of `request` each replica holds (a replica absent: none)."""
        ...


@dataclass(frozen=True, slots=True)
class Prediction:
    """One candidate's predicted latencies for one request."""

    replica_id: str
    cached_tokens: int
    queue_s: float
    """Prefill work ahead of this request on the replica."""
    ttft_s: float
    tpot_s: float
    meets_targets: bool
    """Both predictions within the request's class targets."""
    cost: float
    """(TTFT + the prefill once more) / TTFT target + TPOT / TPOT target (module doc): lower
    is better."""


class PredictedLatency:
    """Routes by predicted TTFT and TPOT against the request's class targets (module doc)."""

    name = "predicted_latency"
    uses_prefix = True

    def __init__(
        self,
        config: RoutingConfig,
        rng: random.Random,
        clock: Callable[[], float],
        step_model: Callable[[str], StepTimeModel],
        index: PrefixIndex | None = None,
        kv_index: KvIndex | None = None,
    ) -> None:
        """`step_model(replica_id)`: that replica's model. `index`: None guesses from what
        this policy sent (`GuessedPrefixIndex`), exact for the replicas of `kv_index` whose
        KV events flow."""
        self._ttft_target_s = tuple(ms / 1000 for ms in config.ttft_target_ms)
        self._tpot_target_s = tuple(ms / 1000 for ms in config.tpot_target_ms)
        self._rng = rng
        self._clock = clock
        self._step_model = step_model
        self._guessed: GuessedPrefixIndex | None = None
        if index is None:
            index = self._guessed = GuessedPrefixIndex(config, kv_index)
        self._index = index
        self._busy_until_s: dict[str, float] = {}
        self._mean_prompt_tokens = 0.0
        self._decisions = 0
        self._cached_tokens = 0
        self._prompt_tokens = 0
        self._predicted_ttft_s = 0.0

    def predict(self, request: RequestView, candidates: Sequence[ReplicaView]) -> list[Prediction]:
        """Every candidate's prediction for `request` now (changes nothing)."""
        return self._predictions(request, candidates, self._clock())

    def choose(self, request: RequestView, candidates: Sequence[ReplicaView]) -> str:
        now = self._clock()
        best = _best(self._predictions(request, candidates, now), self._rng)
        self._sent(request, best, now)
        return best.replica_id

    def _predictions(
        self, request: RequestView, candidates: Sequence[ReplicaView], now: float
    ) -> list[Prediction]:
        cached = self._index.cached_tokens(request)
        klass = min(max(request.priority, 0), len(self._ttft_target_s) - 1)
        ttft_target, tpot_target = self._ttft_target_s[klass], self._tpot_target_s[klass]
        mean = self._mean_prompt_tokens or float(request.prompt_tokens)
        return [
            self._predict(request, view, cached.get(view.replica_id, 0), now, mean,
                          ttft_target, tpot_target)
            for view in candidates
        ]  # fmt: skip

    def forget(self, replica_id: str) -> None:
        self._busy_until_s.pop(replica_id, None)
        if self._guessed is not None:
            self._guessed.forget(replica_id)

    def stats(self) -> Mapping[str, float]:
        return {
            "predicted_decisions": float(self._decisions),
            "predicted_cached_tokens": float(self._cached_tokens),
            "predicted_prompt_tokens": float(self._prompt_tokens),
            "predicted_ttft_s_sum": self._predicted_ttft_s,
        }

    def _predict(
        self,
        request: RequestView,
        view: ReplicaView,
        cached_tokens: int,
        now: float,
        mean_prompt: float,
        ttft_target_s: float,
        tpot_target_s: float,
    ) -> Prediction:
        model = self._step_model(view.replica_id)
        prompt = request.prompt_tokens
        # vLLM computes a prompt's last token even when all of it is cached.
        cached = max(0, min(cached_tokens, prompt - 1))
        batch = view.in_flight
        context = int(batch * mean_prompt)
        # The prefills booked on it are done once nothing the gateway sent is in flight there
        # (a request answered faster than predicted must not leave its replica looking busy).
        booked_s = self._busy_until_s.get(view.replica_id, now) if batch else now
        queue_s = max(0.0, booked_s - now)
        if view.num_requests_waiting:
            waiting_s = view.num_requests_waiting * model.prefill_s(
                int(mean_prompt), 0, batch, context
            )
            queue_s = max(queue_s, waiting_s)
        prefill_s = model.prefill_s(prompt - cached, cached, batch, context)
        ttft_s = queue_s + prefill_s
        tpot_s = model.decode_step_s(batch + 1, context + prompt)
        return Prediction(
            replica_id=view.replica_id,
            cached_tokens=cached,
            queue_s=queue_s,
            ttft_s=ttft_s,
            tpot_s=tpot_s,
            meets_targets=ttft_s <= ttft_target_s and tpot_s <= tpot_target_s,
            cost=(ttft_s + prefill_s) / ttft_target_s + tpot_s / tpot_target_s,
        )

    def _sent(self, request: RequestView, chosen: Prediction, now: float) -> None:
        """Book the chosen replica's prefill and learn from the request."""
        rid = chosen.replica_id
        self._busy_until_s[rid] = now + chosen.ttft_s
        prompt = request.prompt_tokens
        if self._decisions == 0:
            self._mean_prompt_tokens = float(prompt)
        else:
            self._mean_prompt_tokens += _MEAN_WEIGHT * (prompt - self._mean_prompt_tokens)
        self._decisions += 1
        self._cached_tokens += chosen.cached_tokens
        self._prompt_tokens += prompt
        self._predicted_ttft_s += chosen.ttft_s
        if self._guessed is not None:
            self._guessed.record(request, rid)


def _best(predictions: Sequence[Prediction], rng: random.Random) -> Prediction:
    """Meeting both targets first, then the lowest cost; exact ties at random."""
    best = predictions[0]
    ties = 1
    for candidate in predictions[1:]:
        if candidate.meets_targets != best.meets_targets:
            if candidate.meets_targets:
                best, ties = candidate, 1
        elif candidate.cost < best.cost:
            best, ties = candidate, 1
        elif candidate.cost == best.cost:
            ties += 1  # reservoir sampling: each of the tied ones is kept with equal chance
            if rng.randrange(ties) == 0:
                best = candidate
    return best
