"""Workloads: the seeded, reproducible list of requests a benchmark sends.

The same spec and the same tokenizer always give the same requests, prompt for prompt. Every
`RequestSpec.input_tokens` is the exact token count of its `prompt` by that tokenizer, without
special tokens. What the server reports as `usage.prompt_tokens` can be larger: it adds any BOS
token the model prepends and, on the chat endpoint, the chat template and the earlier turns of
a conversation (`history`), which are not part of `prompt`.

The layout (lengths, prefix groups, turns, priorities, sessions) is `load.shapes`'s, from
the same seeded streams; this module fills it with text. The kinds: `load.workload`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from servepilot.bench.prompts import PromptMaker
from servepilot.bench.records import RequestSpec
from servepilot.bench.tokenizer import Tokenizer
from servepilot.load.shapes import (
    check_count,
    label_requests,
    layout_stream,
    mixed_lengths,
    session_id,
    shared_prefix_groups,
    trace_prefix_tokens,
    trace_start_s,
    turn_order,
)
from servepilot.load.trace import TraceLine, load_trace
from servepilot.load.workload import WorkloadKind, WorkloadSpec


def build_workload(spec: WorkloadSpec, tokenizer: Tokenizer, count: int) -> list[RequestSpec]:
    """`count` requests (trace: its first `count` lines, or all when it holds fewer)."""
    check_count(count)
    maker = PromptMaker(tokenizer, seed=spec.seed)
    rng = random.Random(f"{spec.seed}/prompts")
    # Separate streams: turning on a priority mix or sessions must not change the prompts.
    layout = layout_stream(spec)
    match spec.kind:
        case WorkloadKind.RANDOM:
            requests = _plain(spec, maker, rng, [spec.input_tokens] * count)
        case WorkloadKind.MIXED:
            requests = _plain(spec, maker, rng, mixed_lengths(spec, count, layout))
        case WorkloadKind.SHARED_PREFIX:
            requests = _shared_prefix(spec, maker, rng, count, layout)
        case WorkloadKind.MULTI_TURN:
            requests = _multi_turn(spec, maker, rng, count)
        case WorkloadKind.TRACE:
            assert spec.trace_path is not None  # checked by WorkloadSpec
            requests = _trace(spec, maker, rng, load_trace(spec.trace_path)[:count])
    return label_requests(spec, requests)


def _plain(
    spec: WorkloadSpec, maker: PromptMaker, rng: random.Random, lengths: Sequence[int]
) -> list[RequestSpec]:
    prompts = maker.make_prompts(lengths, rng)
    return [
        RequestSpec(index=i, prompt=prompt, max_tokens=spec.output_tokens, input_tokens=n)
        for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True))
    ]


def _shared_prefix(
    spec: WorkloadSpec, maker: PromptMaker, rng: random.Random, count: int, layout: random.Random
) -> list[RequestSpec]:
    groups = shared_prefix_groups(spec, count, layout)
    prefixes = maker.make_prompts([spec.shared_prefix_tokens] * spec.num_prefixes, rng)
    suffix_tokens = spec.input_tokens - spec.shared_prefix_tokens
    prompts = maker.make_prompts(
        [suffix_tokens] * count, rng, prefixes=[prefixes[g] for g in groups]
    )
    return [
        RequestSpec(
            index=i,
            prompt=prompt,
            max_tokens=spec.output_tokens,
            input_tokens=spec.input_tokens,
            prefix_group=group,
        )
        for i, (prompt, group) in enumerate(zip(prompts, groups, strict=True))
    ]


def _multi_turn(
    spec: WorkloadSpec, maker: PromptMaker, rng: random.Random, count: int
) -> list[RequestSpec]:
    order = turn_order(spec, count)
    sent = set(order)
    answered = [(s, t) for s, t in order if (s, t + 1) in sent]
    user_texts = maker.make_prompts([spec.input_tokens] * len(order), rng)
    reply_texts = maker.make_prompts([spec.output_tokens] * len(answered), rng)
    user = dict(zip(order, user_texts, strict=True))
    reply = dict(zip(answered, reply_texts, strict=True))
    requests = []
    for i, (session, turn) in enumerate(order):
        history = tuple(
            message
            for earlier in range(turn)
            for message in (
                ("user", user[session, earlier]),
                ("assistant", reply[session, earlier]),
            )
        )
        requests.append(
            RequestSpec(
                index=i,
                prompt=user[session, turn],
                max_tokens=spec.output_tokens,
                input_tokens=spec.input_tokens,
                history=history,
                session_id=session_id(spec, session),
            )
        )
    return requests


def _trace(
    spec: WorkloadSpec, maker: PromptMaker, rng: random.Random, lines: Sequence[TraceLine]
) -> list[RequestSpec]:
    prefix_len = trace_prefix_tokens(spec, lines)
    groups = sorted(prefix_len)
    prefix_texts = maker.make_prompts([prefix_len[g] for g in groups], rng)
    prefix_of = dict(zip(groups, prefix_texts, strict=True))
    suffix_tokens: list[int] = []
    prefixes: list[str] = []
    for line in lines:
        group = line.prefix_group
        suffix_tokens.append(line.input_tokens - (0 if group is None else prefix_len[group]))
        prefixes.append("" if group is None else prefix_of[group])
    prompts = maker.make_prompts(suffix_tokens, rng, prefixes=prefixes)
    start_s = trace_start_s(lines)
    return [
        RequestSpec(
            index=i,
            prompt=prompt,
            max_tokens=line.output_tokens,
            input_tokens=line.input_tokens,
            at_s=line.timestamp_s - start_s,
            priority=line.priority,
            prefix_group=line.prefix_group,
        )
        for i, (prompt, line) in enumerate(zip(prompts, lines, strict=True))
    ]
