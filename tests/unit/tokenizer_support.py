"""What the tests of exact-length prompts share."""

from __future__ import annotations

from collections.abc import Sequence

from servepilot.bench.tokenizer import LocalTokenizer


def token_counts(tok: LocalTokenizer, texts: Sequence[str]) -> list[int]:
    """How many tokens `tok` makes of each text."""
    return [len(ids) for ids in tok.encode_batch(texts)]
