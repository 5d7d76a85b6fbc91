"""The gateway's CPU per request to key a prompt for the exact prefix index, at 32k tokens.

A multi-turn session (one system prompt, user and assistant turns of about 500 tokens each)
grows until its rendered prompt holds --tokens tokens; the last --requests turns are keyed as
the gateway keys them (`gateway.tokens.PromptBlocks`: the chat template, token ids, vLLM's
block hashes) in three ways, each on a fresh tokenizer that has seen the session's earlier
turns as the gateway would have:

- whole: every prompt tokenised whole (no reuse),
- pieces, shared chains: what the gateway runs (`PromptBlocks.keys`): the pieces between
  special tokens, the prompts that begin with the same pieces sharing their tokens and block
  hashes, so only a new turn's pieces are tokenised and hashed; its template rendering alone,
- pieces without the chains: every piece's ids from the cache, then every block hashed,
- beside the approximate index's text hashing (`routing.prefix`).

CPU time is the process's (time.process_time), per request, median over the requests.

    python benchmarks/bench_prompt_tokens.py [--tokens 32768] [--requests 10] [--block-size 128]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from servepilot.bench.corpus import corpus_paragraphs  # noqa: E402
from servepilot.engine.model_source import embedded_model_dir  # noqa: E402
from servepilot.gateway.tokens import PromptBlocks, PromptTokenizer  # noqa: E402
from servepilot.routing.kv_index import BlockHashing, prompt_block_hashes  # noqa: E402
from servepilot.routing.prefix import prefix_hashes, prompt_text  # noqa: E402

TURN_WORDS = 380  # about 500 tokens of the corpus's prose


def session(
    tokenizer: PromptTokenizer, tokens: int, requests: int
) -> list[tuple[dict[str, Any], int]]:
    """The session's turns (body, prompt tokens), until `requests` of them hold `tokens`."""
    words = (word for paragraph in corpus_paragraphs(35) for word in paragraph.split())
    messages: list[dict[str, str]] = [{"role": "system", "content": _take(words, 200)}]
    turns: list[tuple[dict[str, Any], int]] = []
    long_enough = 0
    while long_enough < requests:
        messages = [*messages, {"role": "user", "content": _take(words, TURN_WORDS)}]
        body = {"model": "m", "messages": messages}
        size = len(tokenizer.body_ids(body) or [])
        turns.append((body, size))
        long_enough += size >= tokens
        messages = [*messages, {"role": "assistant", "content": _take(words, TURN_WORDS)}]
    return turns


def _take(words: Any, count: int) -> str:
    return " ".join(next(words) for _ in range(count))


def cpu_per_request_ms(keys: Callable[[dict[str, Any]], object], bodies: list[Any]) -> float:
    samples = []
    for body in bodies:
        start = time.process_time()
        keys(body)
        samples.append((time.process_time() - start) * 1000)
    return statistics.median(samples)


def _approximate(body: dict[str, Any]) -> object:
    """The text hashing every prefix-aware request pays today (RoutingConfig's defaults:
    64 blocks of 256 characters)."""
    return prefix_hashes(prompt_text(body, 256 * 64), 256, 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32_768)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--block-size", type=int, default=128)
    args = parser.parse_args()
    folder = embedded_model_dir()
    hashing = BlockHashing(args.block_size)
    turns = session(PromptTokenizer(folder), args.tokens, args.requests)
    first = next(i for i, (_, size) in enumerate(turns) if size >= args.tokens)
    warmup = [body for body, _ in turns[:first]]
    measured = [body for body, _ in turns[first:]]
    sizes = [size for _, size in turns[first:]]
    print(f"{len(measured)} requests of {sizes[0]:,}-{sizes[-1]:,} tokens (turns "
          f"{first + 1}-{len(turns)} of one session), block size {args.block_size}")  # fmt: skip

    whole = PromptTokenizer(folder, cache_chars=0)

    def whole_keys(body: dict[str, Any]) -> object:
        return prompt_block_hashes(whole.whole_ids(_rendered(whole, body)), hashing)

    pieces = PromptBlocks(PromptTokenizer(folder), hashing)
    for body in warmup:  # the session's earlier turns went through this gateway
        pieces.keys(body)
    ids = {id(body): pieces.tokenizer.body_ids(body) or [] for body in measured}
    rows = {
        "whole (no reuse)": cpu_per_request_ms(whole_keys, measured),
        "pieces, shared chains (gateway)": cpu_per_request_ms(pieces.keys, measured),
        "  of which template": cpu_per_request_ms(
            lambda body: _rendered(pieces.tokenizer, body), measured
        ),
        "pieces without the chains: ids": cpu_per_request_ms(pieces.tokenizer.body_ids, measured),
        "  and every block hashed": cpu_per_request_ms(
            lambda body: prompt_block_hashes(ids[id(body)], hashing), measured
        ),
        "approximate index (text hashing)": cpu_per_request_ms(_approximate, measured),
    }
    for name, ms in rows.items():
        print(f"{name:32s} {ms:8.2f} ms CPU per request")
    cache = pieces.tokenizer.pieces
    print(f"piece cache: {cache.hits} hits, {cache.misses} misses")
    agentic_turns(folder, hashing)


def agentic_turns(folder: Path, hashing: BlockHashing) -> None:
    """bench-kv-routing's sessions (4 shared system prompts of ~500 tokens, user turns of
    ~90, answers of ~16, a tool result of ~160 every other turn; 40 sessions of 8 turns):
    the keying of each new turn as the gateway sees it, then of the same turns again, both on
    the gateway's way (`keys_async`: on the event loop, or its tokenizer thread for a long
    new prompt)."""
    words = [w for p in itertools.islice(corpus_paragraphs(35), 400) for w in p.split()]
    rng = random.Random(0)

    def text(count: int) -> str:
        start = rng.randrange(len(words) - count)
        return " ".join(words[start : start + count])

    systems = [text(380) for _ in range(4)]
    bodies = []
    for number in range(40):
        messages = [{"role": "system", "content": systems[number % 4]}]
        for turn in range(8):
            messages = [*messages, {"role": "user", "content": text(70)}]
            bodies.append({"model": "m", "messages": messages})
            messages = [*messages, {"role": "assistant", "content": text(12)}]
            if turn % 2:
                messages = [*messages, {"role": "tool", "content": text(120)}]
    blocks = PromptBlocks(PromptTokenizer(folder), hashing)

    async def keyed() -> float:
        start = time.process_time()
        for body in bodies:
            await blocks.keys_async(body)
        return (time.process_time() - start) * 1000 / len(bodies)

    try:
        new_ms = asyncio.run(keyed())
        seen_ms = asyncio.run(keyed())
    finally:
        blocks.close()
    print(f"agentic turns ({len(bodies)}, up to {blocks.keys(bodies[-1]).tokens:,} tokens), "
          f"keyed as the gateway does (keys_async): {new_ms:.2f} ms CPU per new turn, "
          f"{seen_ms:.2f} ms per turn seen before")  # fmt: skip


def _rendered(tokenizer: PromptTokenizer, body: dict[str, Any]) -> str:
    text = tokenizer.rendered(body["messages"])
    assert text is not None, "the embedded model has a chat template"
    return text


if __name__ == "__main__":
    main()
