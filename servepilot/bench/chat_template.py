"""The tokens a chat template adds around a user message, so chat prompts are sized to it.

On /v1/chat/completions the server counts (usage.prompt_tokens) the rendered conversation:
the message's text plus the template's own tokens (SmolLM2's adds a default system prompt and
role markers, 30 tokens in all). `--input-tokens N` means the server sees N tokens, so the
text of a chat message is made N - overhead tokens long. The overhead is measured once per
target, by the same tokenizer the prompts are cut with: one templated count (vLLM's
`/tokenize` with `messages`, or the local folder's chat template) less the text's own count.
/v1/completions sends the text as it is and needs no such measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servepilot.bench.records import Endpoint, RequestRecord, RequestSpec
from servepilot.bench.tokenizer import Tokenizer

# Stripped prose like the corpus's: templates that trim content leave it unchanged.
_SAMPLE = "The server counts every token of the rendered conversation."


@dataclass(frozen=True, slots=True)
class ChatFrame:
    """What the workload subtracts from every chat message's text (0 on completions)."""

    overhead_tokens: int = 0
    """Tokens the chat template adds to one user message: measured, or 0 when unknown."""
    known: bool = True
    """False when the tokenizer could not render the template: counts then exclude it."""

    def describe(self, endpoint: Endpoint, tokenizer_name: str) -> str | None:
        """The line telling the user where the server's count comes from; None if none."""
        if endpoint is not Endpoint.CHAT:
            return None
        if not self.known:
            return (
                f"{tokenizer_name} cannot render the chat template: prompts are sized without "
                "it, so the server's prompt tokens (the table's Server prompt) exceed "
                "--input-tokens by the template's tokens"
            )
        return (
            f"the chat template adds {self.overhead_tokens} tokens to a message: its text is "
            f"made that much shorter, so the server counts --input-tokens"
        )

    def as_target(self, endpoint: Endpoint) -> dict[str, Any]:
        """results.json's record of it (in "target"): the template's tokens, null if unknown."""
        if endpoint is not Endpoint.CHAT:
            return {}
        return {"chat_template_tokens": self.overhead_tokens if self.known else None}


def count_gap_note(
    frame: ChatFrame,
    endpoint: Endpoint,
    sent: Sequence[RequestSpec],
    records: Sequence[RequestRecord],
) -> str | None:
    """The check on the sizing: a line when the server's prompt tokens (usage) differ from
    the asked ones, on the requests it answered, saying where the difference comes from."""
    asked_of = {spec.index: spec.input_tokens for spec in sent if not spec.history}
    pairs = [
        (asked_of[r.index], r.input_tokens)
        for r in records
        if r.ok and r.input_tokens is not None and r.index in asked_of and not r.warmup
    ]
    if not pairs:
        return None
    asked = sum(a for a, _ in pairs) / len(pairs)
    counted = sum(c for _, c in pairs) / len(pairs)
    if abs(counted - asked) < 0.05:
        return None
    if endpoint is not Endpoint.CHAT:
        cause = "what the server adds to a text (a BOS token)"
    elif not frame.known:
        cause = "the chat template, which bench could not count here"
    else:
        cause = (
            f"the chat template, which does not add the same {frame.overhead_tokens} tokens "
            "(measured on one sample) to every text"
        )
    return (
        f"the server counted {counted:,.1f} prompt tokens per request where {asked:,.1f} were "
        f"asked: {counted - asked:+,.1f} from {cause}"
    )


def measure_chat_frame(tokenizer: Tokenizer, endpoint: Endpoint) -> ChatFrame:
    """The template's overhead on `endpoint` by `tokenizer` (one templated count)."""
    if endpoint is not Endpoint.CHAT:
        return ChatFrame()
    text_tokens = len(tokenizer.encode(_SAMPLE))  # first: a dead target fails here, clearly
    templated = tokenizer.count_chat([{"role": "user", "content": _SAMPLE}])
    if templated is None:
        return ChatFrame(known=False)
    return ChatFrame(overhead_tokens=templated - text_tokens)
