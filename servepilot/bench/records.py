"""The two records the load tester passes around: what to send, and what happened.

Times in a `RequestRecord` are seconds since the start of the run, on the monotonic clock of
the process that sent the request.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Endpoint(enum.StrEnum):
    CHAT = "chat"
    """POST /v1/chat/completions with `messages`."""
    COMPLETIONS = "completions"
    """POST /v1/completions with `prompt`."""


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a workload, ready to send."""

    index: int
    prompt: str
    """The text: the whole prompt (completions) or the last user message (chat)."""
    max_tokens: int
    input_tokens: int
    """What the workload asked for, as the server counts it: the tokens of `prompt`, plus on
    chat the template's (taken off the text: `bench.chat_template`); not `history`."""
    history: tuple[tuple[str, str], ...] = ()
    """Earlier (role, content) turns of a chat session, sent before `prompt`."""
    turn: int | None = None
    """multi_turn: which turn of its conversation this is (0 the first, >= 1 a returning
    one, whose earlier turns the server may still hold as cached KV); None for the other
    workloads."""
    at_s: float | None = None
    """Trace replay: the send time relative to the start; None lets the load mode decide."""
    priority: int | None = None
    """Sent as X-Priority (0 interactive, 1 default, 2 batch)."""
    session_id: str | None = None
    """Sent as X-Session-Id."""
    prefix_group: int | None = None
    """Which shared prefix the prompt starts with, for prefix-sharing workloads."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request."""

    index: int
    intended_s: float
    """When the schedule said to send it (open loop); equal to `sent_s` in a closed loop."""
    sent_s: float
    """When the request was written to the connection."""
    chunk_s: tuple[float, ...] = ()
    """Arrival time of every streamed chunk that carried generated content."""
    end_s: float = 0.0
    """Last content chunk, or when the failure was seen."""
    input_tokens: int | None = None
    """usage.prompt_tokens as the server reported it."""
    output_tokens: int | None = None
    """usage.completion_tokens as the server reported it."""
    error: str | None = None
    """Why the request failed (a short reason such as `http_503`); None when it succeeded."""
    error_detail: str = ""
    warmup: bool = False
    """Sent during warm-up: excluded from the results."""
    replica: str | None = None
    """X-Servepilot-Replica of the answer, when the target is a servepilot gateway."""
    extra: dict[str, float] = field(default_factory=dict)
    retry_after_s: float | None = None
    """The Retry-After (seconds) of a refused request, when the server gave one."""
    turn: int | None = None
    """The request's `RequestSpec.turn` (multi_turn only)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def refused(self) -> bool:
        """The server shed this request: 429, or 503 with a Retry-After (a 503 without one
        is an outage, not load shedding)."""
        return self.error == "http_429" or (
            self.error == "http_503" and self.retry_after_s is not None
        )
