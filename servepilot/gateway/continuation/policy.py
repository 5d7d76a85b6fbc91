"""Whether a broken stream goes on, and where (pure: plain data in, a decision out).

The proxy asks once per failure after the first relayed token; it does the I/O (picking
among the allowed replicas through the dispatcher, sending, relaying).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.core.config.gateway import ContinuationConfig
from servepilot.gateway.continuation.transcript import Transcript


class Failure(enum.StrEnum):
    """How a replica's stream broke (the label of servepilot_stream_continuations_total)."""

    RESET = "reset"
    """The connection failed (reset, refused mid-answer)."""
    EOF = "eof"
    """The body ended before the stream's last event."""
    STALL = "stall"
    """No token for the stall deadline."""
    OUT_OF_ROTATION = "out_of_rotation"
    """The pool took the replica out (failed health checks)."""
    ERROR_EVENT = "error_event"
    """The replica sent an error event mid-answer (its engine failed)."""


class GiveUp(enum.StrEnum):
    """Why a broken stream ends with an error event instead."""

    DISABLED = "disabled"
    OPTED_OUT = "opted_out"
    LIMIT = "limit"
    NOT_AT_EVENT_END = "not_at_event_end"
    NOT_CONTINUABLE = "not_continuable"
    NO_REPLICA = "no_replica"
    OVER_MAX_MODEL_LEN = "over_max_model_len"


@dataclass(frozen=True, slots=True)
class Candidate:
    """A replica of the request's model as the pool sees it now."""

    replica_id: str
    serving: bool
    max_model_len: int | None = None


@dataclass(frozen=True, slots=True)
class Continue:
    replica_ids: tuple[str, ...]
    """The replicas the rest may go to (the routing policy picks among them)."""


@dataclass(frozen=True, slots=True)
class Finish:
    """The answer had ended (its finish_reason was sent): only [DONE] is missing."""


@dataclass(frozen=True, slots=True)
class Stop:
    reason: GiveUp
    message: str


Decision = Continue | Finish | Stop


@dataclass(frozen=True, slots=True)
class Situation:
    """Everything the decision depends on."""

    failure: Failure
    continuations: int
    """Continuations this request has had already."""
    opted_out: bool
    sent: Transcript
    continuable: bool
    """The request can be asked again as text (see transcript.continuation_body)."""
    context_tokens: int
    """Prompt tokens (an estimate) plus the tokens sent."""
    used: frozenset[str]
    """Replicas this request has been on."""
    failed_on: str
    """The replica its last part failed on."""


def decide(
    situation: Situation, config: ContinuationConfig, candidates: Sequence[Candidate]
) -> Decision:
    s = situation
    if s.sent.finish_reason is not None and s.sent.whole_events:
        return Finish()
    if not config.enabled:
        return Stop(GiveUp.DISABLED, "stream continuation is off in fleet.yaml")
    if s.opted_out:
        return Stop(GiveUp.OPTED_OUT, "the request opted out of continuation")
    if s.continuations >= config.max_continuations:
        return Stop(GiveUp.LIMIT, f"continued {s.continuations} times already (the limit)")
    if not s.sent.whole_events:
        return Stop(GiveUp.NOT_AT_EVENT_END, "the stream broke inside an event")
    if not s.continuable:
        return Stop(GiveUp.NOT_CONTINUABLE, "the request cannot be continued as text")
    serving = [c for c in candidates if c.serving and c.replica_id != s.failed_on]
    # A replica the request was on before serves again (it came back from a restart): it is
    # taken when no replica new to the request is there.
    left = [c for c in serving if c.replica_id not in s.used] or serving
    if not left:
        return Stop(GiveUp.NO_REPLICA, "no other healthy replica to continue on")
    fits = [c for c in left if c.max_model_len is None or s.context_tokens < c.max_model_len]
    if not fits:
        return Stop(
            GiveUp.OVER_MAX_MODEL_LEN,
            f"the prompt and the {s.sent.tokens} tokens sent no longer fit max_model_len",
        )
    return Continue(tuple(c.replica_id for c in fits))
