"""From per-request records to a run's summary, exactly as DESIGN.md defines each metric.

- TTFT: intended send -> first chunk carrying generated content (so open-loop latency
  includes any time the client spent behind schedule: no coordinated omission).
- E2E: intended send -> last content chunk.
- TPOT: (E2E - TTFT) / (output_tokens - 1), per request, for requests with > 1 token.
- ITL: gaps between consecutive content chunks, pooled over requests.
- goodput: requests per second that met every per-request SLO limit (the TTFT/TPOT/E2E p99
  ones); SLO attainment: their share of all requests, failed ones included.
- the level verdict (`slo_met`, `slo_violated`): the SLO's other limits (itl_*, p50/p90/mean)
  checked on the level's statistics.
Pure functions: no clock, no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servepilot.bench.records import RequestRecord
from servepilot.core.results import ClientHealth, Load, Run, Stats, Window
from servepilot.core.slo import Metric, Slo

_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True, slots=True)
class RequestTimes:
    """One successful request's latencies in ms (TPOT is None below two output tokens)."""

    ttft_ms: float
    e2e_ms: float
    tpot_ms: float | None
    output_tokens: int


def stats(values: Sequence[float]) -> Stats:
    if not values:
        return Stats(mean=None, p50=None, p90=None, p99=None, count=0)
    arr = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(arr, _PERCENTILES)
    return Stats(
        mean=float(arr.mean()), p50=float(p50), p90=float(p90), p99=float(p99), count=len(arr)
    )


def output_tokens(record: RequestRecord) -> int:
    """Server-reported output tokens; the number of content chunks if the server gave none."""
    if record.output_tokens is not None:
        return record.output_tokens
    return len(record.chunk_s)


def request_times(record: RequestRecord) -> RequestTimes | None:
    """Latencies of a successful request; None for a failed one or one with no content."""
    if not record.ok or not record.chunk_s:
        return None
    ttft_ms = (record.chunk_s[0] - record.intended_s) * 1000.0
    e2e_ms = (record.chunk_s[-1] - record.intended_s) * 1000.0
    out = output_tokens(record)
    tpot_ms = (e2e_ms - ttft_ms) / (out - 1) if out > 1 else None
    return RequestTimes(ttft_ms=ttft_ms, e2e_ms=e2e_ms, tpot_ms=tpot_ms, output_tokens=out)


def meets(times: RequestTimes, slo: Slo) -> bool:
    """Within every per-request limit of `slo` (its TTFT/TPOT/E2E p99 limits, held to each
    request); the level limits are the run's verdict, not goodput's (core/slo.py)."""
    ttft, tpot, e2e = (slo.per_request_ms(m) for m in (Metric.TTFT, Metric.TPOT, Metric.E2E))
    if ttft is not None and times.ttft_ms > ttft:
        return False
    if e2e is not None and times.e2e_ms > e2e:
        return False
    return tpot is None or times.tpot_ms is None or times.tpot_ms <= tpot


def measured(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The records that count: warm-up requests are left out."""
    return [r for r in records if not r.warmup]


def window_s(records: Sequence[RequestRecord]) -> float:
    """The measurement window: first intended send to the last request's end."""
    if not records:
        return 0.0
    return max(r.end_s for r in records) - min(r.intended_s for r in records)


def summarize(
    load: Load,
    records: Sequence[RequestRecord],
    slo: Slo,
    *,
    duration_s: float | None = None,
    client: ClientHealth | None = None,
) -> Run:
    """The run summary of `records` (warm-up ones are excluded here)."""
    counted = measured(records)
    duration = duration_s if duration_s is not None else window_s(counted)
    timed = [(r, t) for r in counted if (t := request_times(r)) is not None]
    times = [t for _, t in timed]
    first_turn, returning = _ttft_by_turn(counted, timed)
    ok = [r for r in counted if r.ok]
    good = sum(1 for t in times if meets(t, slo))
    out_tokens = sum(t.output_tokens for t in times)
    in_tokens = sum(r.input_tokens or 0 for r in ok)
    gaps = [b - a for r in ok for a, b in zip(r.chunk_s, r.chunk_s[1:], strict=False)]
    per_s = 1.0 / duration if duration > 0 else 0.0
    inputs = [r.input_tokens for r in ok if r.input_tokens is not None]
    run = Run(
        load=load,
        duration_s=duration,
        completed=len(ok),
        failed=len(counted) - len(ok),
        request_throughput=len(ok) * per_s,
        output_throughput=out_tokens * per_s,
        total_token_throughput=(in_tokens + out_tokens) * per_s,
        ttft_ms=stats([t.ttft_ms for t in times]),
        tpot_ms=stats([t.tpot_ms for t in times if t.tpot_ms is not None]),
        itl_ms=stats([g * 1000.0 for g in gaps]),
        e2e_ms=stats([t.e2e_ms for t in times]),
        ttft_ms_first_turn=first_turn,
        ttft_ms_returning=returning,
        goodput_rps=good * per_s,
        slo_attainment=good / len(counted) if counted else 0.0,
        input_tokens_mean=float(np.mean(inputs)) if inputs else None,
        output_tokens_mean=out_tokens / len(times) if times else None,
        errors=dict(Counter(r.error for r in counted if r.error is not None)),
        client=client,
        refused=sum(1 for r in counted if r.refused),
    )
    return slo.with_verdict(run)


def _ttft_by_turn(
    counted: Sequence[RequestRecord], timed: Sequence[tuple[RequestRecord, RequestTimes]]
) -> tuple[Stats | None, Stats | None]:
    """TTFT of (first, returning) turns when the records carry turns (multi_turn): what a
    CPU tier of the KV cache, or prefix caching at all, changes is how much of a returning
    turn's history is prefilled again. (None, None) for the other workloads."""
    if all(r.turn is None for r in counted):
        return None, None
    first = [t.ttft_ms for r, t in timed if r.turn == 0]
    returning = [t.ttft_ms for r, t in timed if r.turn is not None and r.turn >= 1]
    return stats(first), stats(returning)


def windows(
    records: Sequence[RequestRecord], window_length_s: float, memory_bytes: Sequence[int | None]
) -> tuple[Window, ...]:
    """Split a soak run into windows by when each request ended.

    `memory_bytes[i]` is the target's resident memory sampled at the end of window i (None
    where it could not be read).
    """
    counted = measured(records)
    if not counted or window_length_s <= 0:
        return ()
    start = min(r.intended_s for r in counted)
    n = max(
        len(memory_bytes), int(np.ceil((max(r.end_s for r in counted) - start) / window_length_s))
    )
    buckets: list[list[RequestRecord]] = [[] for _ in range(n)]
    for record in counted:
        index = min(int((record.end_s - start) // window_length_s), n - 1)
        buckets[index].append(record)
    return tuple(
        _window(start + i * window_length_s, window_length_s, bucket,
                memory_bytes[i] if i < len(memory_bytes) else None)
        for i, bucket in enumerate(buckets)
    )  # fmt: skip


def _window(
    start_s: float, length_s: float, bucket: list[RequestRecord], memory: int | None
) -> Window:
    times = [t for r in bucket if (t := request_times(r)) is not None]
    return Window(
        start_s=start_s,
        end_s=start_s + length_s,
        completed=len(times),
        failed=sum(1 for r in bucket if not r.ok),
        request_throughput=len(times) / length_s,
        output_throughput=sum(t.output_tokens for t in times) / length_s,
        ttft_p99_ms=stats([t.ttft_ms for t in times]).p99,
        e2e_p99_ms=stats([t.e2e_ms for t in times]).p99,
        resident_memory_bytes=memory,
    )
