"""The gateway's CPU per request to key a prompt for the exact prefix index, at 32k tokens.

A multi-turn session (one system prompt, user and assistant turns of about 500 tokens each)
grows until its rendered prompt holds --tokens tokens; the last --requests turns are keyed as
the gateway keys them (`gateway.tokens.PromptBlocks`: the chat template, token ids, vLLM's
block hashes) in three ways, each on a fresh tokenizer that has seen the session's earlier
turns as the gateway would have:

- whole: every prompt tokenised whole (no reuse),
- pieces: the pieces between special tokens taken from the cache, only new turns tokenised,
- and the parts of the pieces path alone (template rendering, tokenisation, block hashing),
  beside the approximate index's text hashing that runs today (`routing.prefix`).

CPU time is the process's (time.process_time), per request, median over the requests.

    python benchmarks/bench_prompt_tokens.py [--tokens 32768] [--requests 10] [--block-size 128]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from servepilot.bench.corpus import corpus_paragraphs  # noqa: E402
from servepilot.core.config import RoutingConfig  # noqa: E402
from servepilot.engine.model_source import embedded_model_dir  # noqa: E402
from servepilot.gateway.tokens import PromptBlocks, PromptTokenizer  # noqa: E402
from servepilot.routing.kv_index import BlockHashing, prompt_block_hashes  # noqa: E402
from servepilot.routing.prefix import prefix_hashes, prompt_text  # noqa: E402

TURN_WORDS = 380  # about 500 tokens of the corpus's prose


def session(tokenizer: PromptTokenizer, tokens: int, requests: int) -> list[dict[str, Any]]:
    """The bodies of the session's turns, the last `requests` of them at `tokens` or more."""
    words = iter(" ".join(corpus_paragraphs(35)).split())
    messages: list[dict[str, str]] = [{"role": "system", "content": _take(words, 200)}]
    bodies: list[dict[str, Any]] = []
    while True:
        messages = [*messages, {"role": "user", "content": _take(words, TURN_WORDS)}]
        body = {"model": "m", "messages": messages}
        bodies.append(body)
        size = len(tokenizer.body_ids(body) or [])
        if size >= tokens and len([b for b in bodies if _size(b) >= tokens]) >= requests:
            return bodies
        messages = [*messages, {"role": "assistant", "content": _take(words, TURN_WORDS)}]


_sizes: dict[int, int] = {}


def _size(body: dict[str, Any]) -> int:
    return _sizes.get(id(body), 0)


def _take(words: Any, count: int) -> str:
    return " ".join(next(words) for _ in range(count))


def cpu_per_request_ms(keys: Callable[[dict[str, Any]], object], bodies: list[Any]) -> float:
    samples = []
    for body in bodies:
        start = time.process_time()
        keys(body)
        samples.append((time.process_time() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--block-size", type=int, default=128)
    args = parser.parse_args()
    folder = embedded_model_dir()
    hashing = BlockHashing(args.block_size)
    probe = PromptTokenizer(folder)
    bodies = session(probe, args.tokens, args.requests)
    for body in bodies:
        _sizes[id(body)] = len(probe.body_ids(body) or [])
    measured = [b for b in bodies if _size(b) >= args.tokens][: args.requests]
    warmup = bodies[: bodies.index(measured[0])]
    print(f"{len(measured)} requests of {_size(measured[0]):,}-{_size(measured[-1]):,} tokens "
          f"(turn {len(warmup) + 1} on), block size {args.block_size}")  # fmt: skip

    whole_tok = PromptTokenizer(folder, cache_chars=0)
    whole = PromptBlocks(whole_tok, hashing)

    def whole_keys(body: dict[str, Any]) -> object:
        text = whole_tok._tok.apply_chat_template(
            body["messages"], tokenize=False, add_generation_prompt=True
        )
        return prompt_block_hashes(whole_tok.whole_ids(text), hashing)

    pieces = PromptBlocks(PromptTokenizer(folder), hashing)
    for body in warmup:  # the session's earlier turns went through this gateway
        pieces.keys(body)
    ids = [pieces.tokenizer.body_ids(b) or [] for b in measured]
    rows = {
        "whole (no reuse)": cpu_per_request_ms(whole_keys, measured),
        "pieces (reuse)": cpu_per_request_ms(pieces.keys, measured),
        "  of which template": cpu_per_request_ms(
            lambda b: pieces.tokenizer._tok.apply_chat_template(
                b["messages"], tokenize=False, add_generation_prompt=True
            ),
            measured,
        ),
        "  of which token ids (cached)": cpu_per_request_ms(pieces.tokenizer.body_ids, measured),
        "  of which block hashes": cpu_per_request_ms(
            lambda b: prompt_block_hashes(ids[measured.index(b)], hashing), measured
        ),
        "approximate index today": cpu_per_request_ms(
            lambda b: prefix_hashes(prompt_text(b, 256 * 64), 256, 64), measured
        ),
    }
    _ = RoutingConfig  # the approximate index's defaults: 64 blocks of 256 characters
    for name, ms in rows.items():
        print(f"{name:32s} {ms:8.2f} ms CPU per request")
    cache = pieces.tokenizer.pieces
    print(f"piece cache: {cache.hits} hits, {cache.misses} misses")


if __name__ == "__main__":
    main()
