"""Workloads: the seeded, reproducible list of requests a benchmark sends.

The same spec and the same tokenizer always give the same requests, prompt for prompt. Every
`RequestSpec.input_tokens` is the count the workload asked for, as the server counts it
(usage.prompt_tokens): on completions the text's own tokens (plus any BOS token the model
prepends); on chat, `chat_template_tokens` (`bench.chat_template`) are taken off every user
message's text, so a one-message request renders to exactly that count. A multi-turn request
carries its earlier turns (`history`) on top.

The layout (lengths, prefix groups, turns, priorities, sessions) is `load.shapes`'s, from
the same seeded streams; this module fills it with text. The kinds: `load.workload`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from servepilot.bench.prompts import PromptMaker
from servepilot.bench.records import RequestSpec
from servepilot.bench.tokenizer import Tokenizer
from servepilot.core.errors import ConfigError
from servepilot.load.shapes import (
    agentic_has_no_list,
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


def build_workload(
    spec: WorkloadSpec, tokenizer: Tokenizer, count: int, *, chat_template_tokens: int = 0
) -> list[RequestSpec]:
    """`count` requests (trace: its first `count` lines, or all when it holds fewer), each
    message's text `chat_template_tokens` shorter than its count (0 on completions)."""
    check_count(count)
    sized = _Sizing(chat_template_tokens)
    maker = PromptMaker(tokenizer, seed=spec.seed)
    rng = random.Random(f"{spec.seed}/prompts")
    # Separate streams: turning on a priority mix or sessions must not change the prompts.
    layout = layout_stream(spec)
    match spec.kind:
        case WorkloadKind.RANDOM:
            requests = _plain(spec, maker, rng, [spec.input_tokens] * count, sized)
        case WorkloadKind.MIXED:
            requests = _plain(spec, maker, rng, mixed_lengths(spec, count, layout), sized)
        case WorkloadKind.SHARED_PREFIX:
            requests = _shared_prefix(spec, maker, rng, count, layout, sized)
        case WorkloadKind.MULTI_TURN:
            requests = _multi_turn(spec, maker, rng, count, sized)
        case WorkloadKind.TRACE:
            assert spec.trace_path is not None  # checked by WorkloadSpec
            lines = load_trace(spec.trace_path)[:count]
            requests = _trace(spec, maker, rng, lines, sized)
        case WorkloadKind.AGENTIC:
            raise agentic_has_no_list()  # bench.agentic sends it
    return label_requests(spec, requests)


class _Sizing:
    """Token counts -> text lengths: what the chat template adds comes off each message."""

    def __init__(self, template_tokens: int) -> None:
        self.template_tokens = template_tokens

    def text(self, tokens: int, flag: str = "--input-tokens") -> int:
        return self.rest(tokens, 1, flag)

    def rest(self, tokens: int, least: int, flag: str, after: int = 0) -> int:
        """`tokens` less the template and `after` (a prefix's tokens): at least `least`."""
        left = tokens - self.template_tokens - after
        if left < least:
            taken = f"--prefix-tokens ({after}) and " if after else ""
            raise ConfigError(
                f"{flag} ({tokens}) leaves no room for a message: {taken}the chat template "
                f"({self.template_tokens} tokens, counted by the server) takes it all",
                hint=f"raise {flag}, or send --endpoint completions (no template)",
            )
        return left


def _plain(
    spec: WorkloadSpec,
    maker: PromptMaker,
    rng: random.Random,
    lengths: Sequence[int],
    sized: _Sizing,
) -> list[RequestSpec]:
    prompts = maker.make_prompts([sized.text(n) for n in lengths], rng)
    return [
        RequestSpec(index=i, prompt=prompt, max_tokens=spec.output_tokens, input_tokens=n)
        for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True))
    ]


def _shared_prefix(
    spec: WorkloadSpec,
    maker: PromptMaker,
    rng: random.Random,
    count: int,
    layout: random.Random,
    sized: _Sizing,
) -> list[RequestSpec]:
    groups = shared_prefix_groups(spec, count, layout)
    prefix = spec.shared_prefix_tokens
    # The template's tokens come off the suffix: the prefix stays as long as asked.
    suffix_tokens = sized.rest(spec.input_tokens, 0, "--input-tokens", after=prefix)
    prefixes = maker.make_prompts([prefix] * spec.num_prefixes, rng)
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
    spec: WorkloadSpec, maker: PromptMaker, rng: random.Random, count: int, sized: _Sizing
) -> list[RequestSpec]:
    order = turn_order(spec, count)
    sent = set(order)
    answered = [(s, t) for s, t in order if (s, t + 1) in sent]
    user_texts = maker.make_prompts([sized.text(spec.input_tokens)] * len(order), rng)
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
                turn=turn,
                session_id=session_id(spec, session),
            )
        )
    return requests


def _trace(
    spec: WorkloadSpec,
    maker: PromptMaker,
    rng: random.Random,
    lines: Sequence[TraceLine],
    sized: _Sizing,
) -> list[RequestSpec]:
    prefix_len = _trace_prefix_text(trace_prefix_tokens(spec, lines), lines, sized)
    groups = sorted(prefix_len)
    prefix_texts = maker.make_prompts([prefix_len[g] for g in groups], rng)
    prefix_of = dict(zip(groups, prefix_texts, strict=True))
    suffix_tokens: list[int] = []
    prefixes: list[str] = []
    for line in lines:
        group = line.prefix_group
        shared = 0 if group is None else prefix_len[group]
        suffix_tokens.append(sized.rest(line.input_tokens, 0, "a trace's input_tokens", shared))
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


def _trace_prefix_text(
    prefix_len: dict[int, int], lines: Sequence[TraceLine], sized: _Sizing
) -> dict[int, int]:
    """A group's prefix is its shortest line; that line's text is the template shorter, so the
    prefix shrinks with it (every line's text still starts with the whole prefix)."""
    shortest_text = dict(prefix_len)
    for line in lines:
        group = line.prefix_group
        if group is not None:
            text = sized.text(line.input_tokens, "a trace's input_tokens")
            shortest_text[group] = min(shortest_text[group], text)
    return shortest_text
