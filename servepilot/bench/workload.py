"""Workloads: the seeded, reproducible list of requests a benchmark sends.

The same spec and the same tokenizer always give the same requests, prompt for prompt. Every
`RequestSpec.input_tokens` is the exact token count of its `prompt` by that tokenizer, without
special tokens. What the server reports as `usage.prompt_tokens` can be larger: it adds any BOS
token the model prepends and, on the chat endpoint, the chat template and the earlier turns of
a conversation (`history`), which are not part of `prompt`.

Kinds:
- random: every prompt `input_tokens` long.
- mixed: short and long prompts mixed: exactly round(count x long_fraction) of them are
  `long_input_tokens` long (by default 4 x input_tokens), at seeded places.
- shared_prefix: `num_prefixes` prefixes of `prefix_tokens` tokens, each followed by its own
  suffix up to `input_tokens` in all; with count = N x M, N prefixes x M suffixes.
- multi_turn: conversations of `turns` turns; each turn carries the earlier ones (user prompt,
  then a synthetic assistant reply of `output_tokens` tokens) as history, so the history is a
  prefix the server can cache. `active_sessions` conversations are interleaved turn by turn.
- trace: replay of a JSONL trace (see trace.py) at its timestamps.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from servepilot.bench.prompts import PromptMaker
from servepilot.bench.records import RequestSpec
from servepilot.bench.tokenizer import Tokenizer
from servepilot.core.errors import ConfigError
from servepilot.load.trace import PRIORITIES, TraceLine, load_trace


class _HasLabels(Protocol):
    """A request record (RequestSpec, RequestShape): a dataclass with these two fields."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def priority(self) -> int | None: ...

    @property
    def session_id(self) -> str | None: ...


_Labelled = TypeVar("_Labelled", bound=_HasLabels)


class WorkloadKind(enum.StrEnum):
    RANDOM = "random"
    MIXED = "mixed"
    SHARED_PREFIX = "shared_prefix"
    MULTI_TURN = "multi_turn"
    TRACE = "trace"


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """What to send. Each field names the `servepilot bench` flag it comes from."""

    kind: WorkloadKind = WorkloadKind.RANDOM
    input_tokens: int = 512
    """--input-tokens: prompt length (shared_prefix: prefix included; multi_turn: per turn)."""
    output_tokens: int = 128
    """--output-tokens: max_tokens of every request, and the length of synthetic replies."""
    seed: int = 0
    """--seed: prompts, mixes and draws all follow from it."""
    long_fraction: float = 0.2
    """--long-fraction (mixed): share of long prompts."""
    long_input_tokens: int | None = None
    """--long-input-tokens (mixed): length of the long prompts; None means 4 x input_tokens."""
    num_prefixes: int = 8
    """--num-prefixes (shared_prefix)."""
    prefix_tokens: int | None = None
    """--prefix-tokens (shared_prefix, trace prefix groups); None means 3/4 of input_tokens."""
    turns: int = 4
    """--turns (multi_turn): turns per conversation."""
    active_sessions: int = 16
    """--active-sessions (multi_turn): conversations interleaved at a time."""
    trace_path: Path | None = None
    """--trace (trace): the JSONL file to replay."""
    priority_mix: Mapping[int, float] | None = None
    """--priority-mix: weight of each X-Priority class (0, 1, 2), drawn per request."""
    sessions: int | None = None
    """--sessions: spread requests over this many X-Session-Id values (not multi_turn,
    where every conversation is its own session)."""

    def __post_init__(self) -> None:
        _at_least(self.input_tokens, 1, "--input-tokens")
        _at_least(self.output_tokens, 1, "--output-tokens")
        if not 0.0 <= self.long_fraction <= 1.0:
            raise ConfigError(f"--long-fraction must be in [0, 1], got {self.long_fraction}")
        _at_least(self.long_tokens, 1, "--long-input-tokens")
        _at_least(self.num_prefixes, 1, "--num-prefixes")
        _at_least(self.shared_prefix_tokens, 1, "--prefix-tokens")
        if (
            self.kind is WorkloadKind.SHARED_PREFIX
            and self.shared_prefix_tokens >= self.input_tokens
        ):
            raise ConfigError(
                f"--prefix-tokens ({self.shared_prefix_tokens}) must be less than "
                f"--input-tokens ({self.input_tokens}): the prompt is prefix plus suffix"
            )
        _at_least(self.turns, 1, "--turns")
        _at_least(self.active_sessions, 1, "--active-sessions")
        if self.kind is WorkloadKind.TRACE and self.trace_path is None:
            raise ConfigError("--workload trace needs --trace FILE")
        if self.priority_mix is not None:
            _check_priority_mix(self.priority_mix)
        if self.sessions is not None:
            _at_least(self.sessions, 1, "--sessions")
            if self.kind is WorkloadKind.MULTI_TURN:
                raise ConfigError(
                    "--sessions does not apply to --workload multi_turn: "
                    "every conversation is its own session"
                )

    @property
    def long_tokens(self) -> int:
        return 4 * self.input_tokens if self.long_input_tokens is None else self.long_input_tokens

    @property
    def shared_prefix_tokens(self) -> int:
        if self.prefix_tokens is not None:
            return self.prefix_tokens
        return max(1, 3 * self.input_tokens // 4)


def build_workload(spec: WorkloadSpec, tokenizer: Tokenizer, count: int) -> list[RequestSpec]:
    """`count` requests (trace: its first `count` lines, or all when it holds fewer)."""
    if count < 0:
        raise ConfigError(f"--requests must be at least 0, got {count}")
    maker = PromptMaker(tokenizer, seed=spec.seed)
    rng = random.Random(f"{spec.seed}/prompts")
    # Separate streams: turning on a priority mix or sessions must not change the prompts.
    layout = random.Random(f"{spec.seed}/layout")
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


def describe(spec: WorkloadSpec) -> dict[str, Any]:
    """The results file's "workload" section: every parameter that shaped the requests."""
    out: dict[str, Any] = {"kind": str(spec.kind), "seed": spec.seed}
    if spec.kind is not WorkloadKind.TRACE:
        out |= {"input_tokens": spec.input_tokens, "output_tokens": spec.output_tokens}
    match spec.kind:
        case WorkloadKind.MIXED:
            out |= {"long_fraction": spec.long_fraction, "long_input_tokens": spec.long_tokens}
        case WorkloadKind.SHARED_PREFIX:
            out |= {"num_prefixes": spec.num_prefixes, "prefix_tokens": spec.shared_prefix_tokens}
        case WorkloadKind.MULTI_TURN:
            out |= {"turns": spec.turns, "active_sessions": spec.active_sessions}
        case WorkloadKind.TRACE:
            out |= {"trace": str(spec.trace_path), "prefix_tokens": spec.shared_prefix_tokens}
        case WorkloadKind.RANDOM:
            pass
    if spec.priority_mix is not None:
        out["priority_mix"] = {str(k): v for k, v in sorted(spec.priority_mix.items())}
    if spec.sessions is not None:
        out["sessions"] = spec.sessions
    return out


def parse_priority_mix(text: str) -> dict[int, float]:
    """`0=0.2,1=0.6,2=0.2` (the --priority-mix flag) as {0: 0.2, 1: 0.6, 2: 0.2}."""
    mix: dict[int, float] = {}
    for part in text.split(","):
        key, sep, weight = part.partition("=")
        try:
            if not sep:
                raise ValueError(part)
            mix[int(key)] = float(weight)
        except ValueError as exc:
            raise ConfigError(
                f"--priority-mix {text!r}: expected CLASS=WEIGHT pairs like 0=0.2,1=0.6,2=0.2"
            ) from exc
    _check_priority_mix(mix)
    return mix


def _plain(
    spec: WorkloadSpec, maker: PromptMaker, rng: random.Random, lengths: Sequence[int]
) -> list[RequestSpec]:
    prompts = maker.make_prompts(lengths, rng)
    return [
        RequestSpec(index=i, prompt=prompt, max_tokens=spec.output_tokens, input_tokens=n)
        for i, (prompt, n) in enumerate(zip(prompts, lengths, strict=True))
    ]


def mixed_lengths(spec: WorkloadSpec, count: int, layout: random.Random) -> list[int]:
    # An exact share rather than a draw per request, so even a short run has the asked mix.
    n_long = round(count * spec.long_fraction)
    lengths = [spec.long_tokens] * n_long + [spec.input_tokens] * (count - n_long)
    layout.shuffle(lengths)
    return lengths


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


def shared_prefix_groups(spec: WorkloadSpec, count: int, layout: random.Random) -> list[int]:
    """Which prefix each request starts with: every prefix equally often, in seeded order."""
    groups = [i % spec.num_prefixes for i in range(count)]
    layout.shuffle(groups)
    return groups


def turn_order(spec: WorkloadSpec, count: int) -> list[tuple[int, int]]:
    """(conversation, turn) in send order: waves of conversations, turn-major in a wave.

    A wave has active_sessions conversations, fewer when fewer requests remain, so a short run
    still holds whole conversations rather than many first turns.
    """
    order: list[tuple[int, int]] = []
    first = 0
    while len(order) < count:
        remaining = count - len(order)
        size = min(spec.active_sessions, math.ceil(remaining / spec.turns))
        wave = range(first, first + size)
        order.extend((session, turn) for turn in range(spec.turns) for session in wave)
        first += size
    return order[:count]


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
                session_id=f"conv-{spec.seed}-{session}",
            )
        )
    return requests


def _trace(
    spec: WorkloadSpec, maker: PromptMaker, rng: random.Random, lines: Sequence[TraceLine]
) -> list[RequestSpec]:
    # A group's prefix fits its shortest request, so every member can start with all of it.
    prefix_len: dict[int, int] = {}
    for line in lines:
        if line.prefix_group is not None:
            shortest = min(prefix_len.get(line.prefix_group, line.input_tokens), line.input_tokens)
            prefix_len[line.prefix_group] = min(spec.shared_prefix_tokens, shortest)
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
    start_s = lines[0].timestamp_s if lines else 0.0
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


def label_requests(spec: WorkloadSpec, requests: list[_Labelled]) -> list[_Labelled]:
    """Priority classes and session ids, each from its own seeded stream."""
    if spec.priority_mix is not None:
        classes = sorted(spec.priority_mix)
        weights = [spec.priority_mix[c] for c in classes]
        draw = random.Random(f"{spec.seed}/priority")
        requests = [
            # A trace's own priority wins over the mix.
            r
            if r.priority is not None
            else dataclasses.replace(r, priority=_pick(draw, classes, weights))
            for r in requests
        ]
    if spec.sessions is not None:
        draw = random.Random(f"{spec.seed}/sessions")
        requests = [
            dataclasses.replace(r, session_id=f"sess-{spec.seed}-{draw.randrange(spec.sessions)}")
            for r in requests
        ]
    return requests


def _pick(draw: random.Random, classes: list[int], weights: list[float]) -> int:
    return draw.choices(classes, weights)[0]


def _check_priority_mix(mix: Mapping[int, float]) -> None:
    for cls, weight in mix.items():
        if cls not in PRIORITIES:
            raise ConfigError(f"--priority-mix: class {cls} is not one of 0, 1, 2")
        if not (math.isfinite(weight) and weight >= 0):
            raise ConfigError(f"--priority-mix: weight of class {cls} must be >= 0, got {weight}")
    if not mix or sum(mix.values()) <= 0:
        raise ConfigError("--priority-mix: the weights must add up to more than 0")


def _at_least(value: int, minimum: int, flag: str) -> None:
    if value < minimum:
        raise ConfigError(f"{flag} must be at least {minimum}, got {value}")
