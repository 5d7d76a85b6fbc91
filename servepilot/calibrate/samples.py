"""Calibration probes' records as engine steps of known shape (pure: no I/O).

Two kinds of probe, each built so that a client-side time is one engine step whose shape
(`StepShape`) is known without seeing inside the engine:

- prefill: one request alone on an idle engine, `max_tokens` 1: one prefill step of its prompt
  (a prompt within the step's token budget is never chunked). vLLM's own timing of it
  (request_prefill_time, scheduled to first token) is the step; the client's TTFT minus that
  is the request's cost outside the engine (HTTP, tokenizing, streaming), kept apart as the
  profile's request overhead, since it delays a request without occupying the engine. Without
  vLLM's timing, the TTFT is the step, overhead included.
- wave: N decoders sent together, with `ignore_eos` and a fixed output length. Once the last
  of them has its first token and until the first one ends, every step decodes all N, one
  token each, so the gap between two consecutive tokens of a stream is one step of N
  decoders. Their context is known: the step that gives a stream its token m (m >= 2) reads
  its prompt and its tokens 1 .. m - 2 from KV (token m - 1 is the step's input). Injected
  into the wave one at a time, requests with `max_tokens` 1 add one mixed step each: their
  whole prompt next to the N decoders, which shows as one long gap in every stream, ending
  when the injected request gets its token.

Every gap is read in every stream and the median taken, so a stream whose server merged two
tokens into one chunk (its gap then spans two steps) does not skew a step.
"""

from __future__ import annotations

import bisect
import enum
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from servepilot.bench.records import RequestRecord
from servepilot.plan.costmodel import StepShape, prefill_pairs

SEGMENT_STEPS = 8
"""Pure decode steps summarized per sample (their median time, their mean context)."""
MIN_SEGMENT_STEPS = 4
TOLERANCE = 0.3
"""Chunks of one step reach the client within a few ms of each other; a token is matched
to a step when it lands within this share of the step's length from the step's end."""


EMPTY_ANSWER = "no_content"
"""servepilot bench's error for an answer without text: with max_tokens 1, a token that
decodes to nothing (an end-of-turn token under ignore_eos). The engine still ran the step."""


class ProbeKind(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """One measured engine step."""

    kind: ProbeKind
    shape: StepShape
    seconds: float
    steps: int = 1
    """Steps summarized (their median): 1 for prefill and mixed samples."""

    @property
    def label(self) -> str:
        s = self.shape
        match self.kind:
            case ProbeKind.PREFILL:
                return f"prefill {s.prefill_tokens}"
            case ProbeKind.DECODE:
                return f"decode {s.decode_seqs} seqs"
            case ProbeKind.MIXED:
                return f"prefill {s.prefill_tokens} + decode {s.decode_seqs}"


@dataclass(frozen=True, slots=True)
class Injection:
    """A request injected into a wave, with what the server said of its prompt."""

    record: RequestRecord
    cached_tokens: int = 0
    """Prompt tokens the prefix cache supplied (vLLM's counter, read around the request)."""


def prefill_sample(
    record: RequestRecord, cached_tokens: int = 0, engine_s: float | None = None
) -> ProbeSample | None:
    """A lone request as one prefill step: the engine's own time for it (`engine_s`, vLLM's
    request_prefill_time) when known, else its TTFT. None when it failed or reported no
    usage."""
    if not record.input_tokens or record.input_tokens - cached_tokens < 1:
        return None
    if record.ok and record.chunk_s:
        ttft = record.chunk_s[0] - record.sent_s
        # The engine's time cannot exceed what the client saw; if it does, the counters
        # were moved by something else (another client), so trust the client.
        seconds = engine_s if engine_s is not None and 0 < engine_s <= ttft else ttft
    elif record.error == EMPTY_ANSWER and engine_s is not None and engine_s > 0:
        seconds = engine_s  # the step ran; its one token just had no text
    else:
        return None
    computed = record.input_tokens - cached_tokens
    shape = StepShape(
        prefill_tokens=computed,
        prefill_seqs=1,
        decode_seqs=0,
        context_tokens=cached_tokens,
        prefill_pairs=prefill_pairs(computed, cached_tokens),
    )
    return ProbeSample(ProbeKind.PREFILL, shape, seconds)


@dataclass(frozen=True, slots=True)
class _Stream:
    prompt: int
    chunks: tuple[float, ...]

    def nearest(self, t: float) -> int:
        """Index of the chunk closest to time t."""
        i = bisect.bisect_left(self.chunks, t)
        if i == len(self.chunks):
            return i - 1
        if i > 0 and t - self.chunks[i - 1] <= self.chunks[i] - t:
            return i - 1
        return i


def wave_samples(
    decoders: Sequence[RequestRecord],
    injections: Sequence[Injection] = (),
    *,
    segment_steps: int = SEGMENT_STEPS,
) -> list[ProbeSample]:
    """The decode and mixed steps of one wave. Steps before every decoder has its first
    token, or after one has finished, are left out: their shape is not known."""
    streams = [
        _Stream(r.input_tokens, r.chunk_s)
        for r in decoders
        if r.ok and r.input_tokens and len(r.chunk_s) >= 3
    ]
    if not streams or len(streams) < len(decoders):
        return []  # a failed decoder: the batch size of every step is uncertain
    start = max(s.chunks[0] for s in streams)
    end = min(s.chunks[-1] for s in streams)
    reference = max(streams, key=lambda s: len(s.chunks))
    typical = statistics.median(b - a for a, b in itertools.pairwise(reference.chunks))
    slack = TOLERANCE * typical
    ends = [t for t in reference.chunks if start + slack < t <= end + slack]
    mixed: dict[int, Injection] = {}
    for injection in injections:
        at = _step_of(injection, ends, slack)
        if at is not None:
            mixed[at] = injection
    samples: list[ProbeSample] = []
    decode_run: list[tuple[float, int]] = []
    for index, t in enumerate(ends):
        step = _step_at(streams, t, slack)
        if step is None:
            _flush(decode_run, len(streams), segment_steps, samples)
            continue
        seconds, context = step
        injected = mixed.get(index)
        if injected is None:
            decode_run.append((seconds, context))
            if len(decode_run) == segment_steps:
                _flush(decode_run, len(streams), segment_steps, samples)
            continue
        _flush(decode_run, len(streams), segment_steps, samples)
        sample = _mixed_sample(injected, len(streams), context, seconds)
        if sample is not None:
            samples.append(sample)
    _flush(decode_run, len(streams), segment_steps, samples)
    return samples


def _step_of(injection: Injection, ends: Sequence[float], slack: float) -> int | None:
    """Which step (index into `ends`) produced the injected request's token."""
    record = injection.record
    if not record.ok or not record.chunk_s or not ends:
        return None
    first = record.chunk_s[0]
    i = bisect.bisect_left(ends, first)
    candidates = [j for j in (i - 1, i) if 0 <= j < len(ends)]
    best = min(candidates, key=lambda j: abs(ends[j] - first))
    return best if abs(ends[best] - first) <= slack else None


def _step_at(streams: Sequence[_Stream], t: float, slack: float) -> tuple[float, int] | None:
    """(seconds, context tokens) of the step whose tokens reached the client at about t:
    the median over streams of the gap that ends there, and the decoders' KV tokens."""
    gaps: list[float] = []
    context = 0
    for stream in streams:
        i = stream.nearest(t)
        if i < 1 or abs(stream.chunks[i] - t) > slack:
            return None  # some stream has no token at this step: not a step of all N
        gaps.append(stream.chunks[i] - stream.chunks[i - 1])
        # Chunk i is token i + 1; that step's input was token i, so KV held the prompt and
        # tokens 1 .. i - 1.
        context += stream.prompt + i - 1
    return statistics.median(gaps), context


def _mixed_sample(
    injection: Injection, decoders: int, context: int, seconds: float
) -> ProbeSample | None:
    prompt = injection.record.input_tokens
    if not prompt or prompt - injection.cached_tokens < 1:
        return None
    chunk = prompt - injection.cached_tokens
    shape = StepShape(
        prefill_tokens=chunk,
        prefill_seqs=1,
        decode_seqs=decoders,
        context_tokens=context + injection.cached_tokens,
        prefill_pairs=prefill_pairs(chunk, injection.cached_tokens),
    )
    return ProbeSample(ProbeKind.MIXED, shape, seconds)


def _flush(
    run: list[tuple[float, int]], decoders: int, size: int, samples: list[ProbeSample]
) -> None:
    """Summarize the pure decode steps gathered so far as one sample, then start over."""
    if len(run) >= min(MIN_SEGMENT_STEPS, size):
        seconds = statistics.median(s for s, _ in run)
        context = round(sum(c for _, c in run) / len(run))
        shape = StepShape(0, 0, decoders, context, 0)
        samples.append(ProbeSample(ProbeKind.DECODE, shape, seconds, steps=len(run)))
    run.clear()


def relative_error(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured; inf when nothing was measured."""
    return (predicted - measured) / measured if measured > 0 else math.inf
