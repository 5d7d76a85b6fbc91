"""The agentic workload's parameters: sessions of an agent and its user, turn after turn.

A session starts with one of `system_prompts` shared system prompts and a user message; every
later turn sends the whole conversation so far (the previous prompt and the previous answer)
plus one new message: a tool's result (`tool_fraction` of the turns after the first, sent
`tool_s` on average after the answer: the tool ran) or the user's next message (`think_s` on
average after the answer: the user read and typed). A `return_fraction` of the sessions go
away once, for `return_gap_s`, and come back to a context that other sessions' traffic has
likely evicted by then. Waits are exponential (seeded per session); lengths are fixed, so
every turn's prompt length is known in advance (the answer has `output_tokens` tokens:
bench asks for exactly that many with ignore_eos).

`load.sessions` lays the sessions out and schedules their turns, for bench and sim alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from servepilot.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class AgenticSpec:
    """Each field names the `servepilot bench` flag it comes from."""

    system_prompts: int = 4
    """--system-prompts: distinct system prompts, shared by the sessions (each picks one)."""
    system_prompt_tokens: int = 512
    """--system-prompt-tokens: length of each system prompt."""
    tool_fraction: float = 0.5
    """--tool-fraction: share of the turns after the first that carry a tool's result."""
    tool_tokens: int = 128
    """--tool-tokens: length of a tool's result."""
    think_s: float = 2.0
    """--think-time: mean wait (exponential) between an answer and the user's next message."""
    tool_s: float = 0.5
    """--tool-time: mean wait (exponential) between an answer and the tool's result."""
    return_fraction: float = 0.25
    """--return-fraction: share of the sessions that leave once and come back."""
    return_gap_s: float = 30.0
    """--return-gap: how long a leaving session stays away (fixed: long enough for other
    sessions' traffic to evict its blocks, which is the point of it)."""

    def __post_init__(self) -> None:
        _at_least(self.system_prompts, 1, "--system-prompts")
        _at_least(self.system_prompt_tokens, 1, "--system-prompt-tokens")
        _at_least(self.tool_tokens, 1, "--tool-tokens")
        for value, flag in ((self.tool_fraction, "--tool-fraction"),
                            (self.return_fraction, "--return-fraction")):  # fmt: skip
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{flag} must be in [0, 1], got {value}")
        for seconds, flag in ((self.think_s, "--think-time"), (self.tool_s, "--tool-time"),
                              (self.return_gap_s, "--return-gap")):  # fmt: skip
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ConfigError(f"{flag} must be a number of seconds >= 0, got {seconds}")

    def describe(self) -> dict[str, Any]:
        return {
            "system_prompts": self.system_prompts,
            "system_prompt_tokens": self.system_prompt_tokens,
            "tool_fraction": self.tool_fraction,
            "tool_tokens": self.tool_tokens,
            "think_s": self.think_s,
            "tool_s": self.tool_s,
            "return_fraction": self.return_fraction,
            "return_gap_s": self.return_gap_s,
        }


def _at_least(value: int, minimum: int, flag: str) -> None:
    if value < minimum:
        raise ConfigError(f"{flag} must be at least {minimum}, got {value}")
