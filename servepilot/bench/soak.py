"""A soak's memory: the target's resident memory from its /metrics and, where the caller
can read them (a servepilot fleet on this machine: fleet/soak_memory.py), more sources (each
replica process, each GPU), sampled at the start and at the end of every window."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp

from servepilot.bench.metrics import measured, windows
from servepilot.bench.records import RequestRecord
from servepilot.core.results import Run
from servepilot.engine.metrics import parse_metrics

MemorySampler = Callable[[], dict[str, int]]
"""Bytes by source name, read now (it may block: it runs in a thread)."""


@dataclass(frozen=True, slots=True)
class MemorySample:
    target_bytes: int | None
    sources_bytes: dict[str, int] = field(default_factory=dict)


async def sample_memory(metrics_url: str, sources: MemorySampler | None) -> MemorySample:
    target = await _resident_memory(metrics_url)
    if sources is None:
        return MemorySample(target)
    try:
        return MemorySample(target, await asyncio.to_thread(sources))
    except Exception:  # a soak must not die because a process or the GPU driver hiccuped
        return MemorySample(target)


async def sample_every(
    metrics_url: str, sources: MemorySampler | None, window_s: float, into: list[MemorySample]
) -> None:
    """Append a sample now and at the end of every window (until cancelled), on a schedule
    from the start: the time a sample takes does not push the next ones later."""
    clock = asyncio.get_running_loop().time
    start_s = clock()
    into.append(await sample_memory(metrics_url, sources))
    for window in itertools.count(1):
        await asyncio.sleep(max(0.0, start_s + window * window_s - clock()))
        into.append(await sample_memory(metrics_url, sources))


def with_soak(
    run: Run, records: Sequence[RequestRecord], window_s: float, samples: Sequence[MemorySample]
) -> Run:
    """`run` with its windows and the memory growth per request of the target and of each
    source. samples[0] is the start, then one at the end of each window, the last taken when
    the load ended (see `window_samples`)."""
    count = len(windows(records, window_s, []))
    ends = window_samples(samples, count)
    split = windows(records, window_s, [s.target_bytes if s else None for s in ends])
    split = tuple(
        w.model_copy(update={"memory_by_source_bytes": end.sources_bytes}) if end else w
        for w, end in zip(split, ends, strict=True)
    )
    targets = [s.target_bytes for s in samples if s.target_bytes is not None]
    growth = None
    if len(targets) >= 2 and run.completed:
        growth = (targets[-1] - targets[0]) / run.completed
    return run.model_copy(
        update={
            "windows": split,
            "memory_growth_bytes_per_request": growth,
            "memory_growth_by_source_bytes_per_request": growth_by_source(samples, run.completed),
        }
    )


def window_samples(samples: Sequence[MemorySample], count: int) -> list[MemorySample | None]:
    """The sample that ends each of `count` windows: the first taken at or after its end.
    The timer samples each window's end in order, but it drifts (each sample takes time) and
    is stopped when the load ends, so it can miss the last ends; the sample taken after the
    load (the last one) is then the first after each of those, as it is after the last."""
    ends = list(samples[1:])
    if not ends:
        return [None] * count
    timed, last = ends[:-1], ends[-1]
    return [timed[i] if i < len(timed) and i < count - 1 else last for i in range(count)]


def finished_windows(
    records: Sequence[RequestRecord], window_s: float, stopped_s: float
) -> tuple[int, float]:
    """Of a soak stopped at `stopped_s`: how many whole windows had passed, and when the last
    of them ended (the records' clock). Windows start at the first measured request."""
    counted = measured(records)
    if not counted or window_s <= 0:
        return 0, stopped_s
    start_s = min(r.intended_s for r in counted)
    done = max(int((stopped_s - start_s) // window_s), 0)
    return done, start_s + done * window_s


def growth_by_source(samples: Sequence[MemorySample], completed: int) -> dict[str, float]:
    """(last - first) / completed for each source seen in two samples or more."""
    if not completed:
        return {}
    seen: dict[str, list[int]] = {}
    for sample in samples:
        for name, value in sample.sources_bytes.items():
            seen.setdefault(name, []).append(value)
    return {name: (v[-1] - v[0]) / completed for name, v in seen.items() if len(v) >= 2}


async def _resident_memory(url: str) -> int | None:
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            session.get(url) as resp,
        ):
            if resp.status != 200:
                return None
            return parse_metrics(await resp.text()).process_resident_memory_bytes
    except Exception:  # a soak must not die because the target's /metrics hiccuped
        return None
