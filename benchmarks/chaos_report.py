"""bench_chaos.py's results: the counts of every verdict, the cost of the faults (TTFT and
TPOT p99 of the streams that overlapped one against the others, a hung replica's longest
silence against the issue's bound), and the short table it prints.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from benchmarks.chaos_load import Stream

SETTLE_S = 5.0
"""A fault's window lasts this long after it is over (streams queued behind it)."""


@dataclass
class Window:
    """A fault, from its start until it was over."""

    kind: str
    replica: str
    start_s: float
    end_s: float
    note: str = ""


def results(
    args: argparse.Namespace,
    windows: list[Window],
    sent: list[Stream],
    *,
    continued: int,
    gateway_restart: dict[str, float],
    batch: dict[str, Any],
    elapsed_s: float,
) -> dict[str, Any]:
    """Every stream sent, and the counts and costs `table` prints."""
    verdicts = [s.verdict(args.max_tokens) for s in sent]
    faulted = [s for s in sent if any(_overlaps(s, w) for w in windows)]
    quiet = [s for s in sent if s not in faulted and s.error is None]
    return {
        "date": datetime.date.today().isoformat(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "elapsed_s": elapsed_s,
        "sent": len(sent),
        "completed": verdicts.count("completed"),
        "continued": continued,
        "failed": verdicts.count("failed"),
        "duplicated": verdicts.count("duplicated"),
        "cut": verdicts.count("cut"),
        "refused": verdicts.count("refused"),
        "faults": [asdict(w) for w in windows],
        "ttft_p99_ms": {"quiet": p99(quiet, "ttft_s"), "faulted": p99(faulted, "ttft_s")},
        "tpot_p99_ms": {"quiet": p99(quiet, "tpot_s"), "faulted": p99(faulted, "tpot_s")},
        "hang": _hang_cost(args.stall_timeout_s, windows, sent, quiet),
        "gateway_restart": gateway_restart,
        "batch": batch,
        "failures": [
            _row(s, args.max_tokens, windows)
            for s in sent
            if s.verdict(args.max_tokens) == "failed"
        ][:10],
        "streams": [_row(s, args.max_tokens, windows) for s in sent],
    }


def _hang_cost(
    stall_timeout_s: float, windows: list[Window], sent: list[Stream], quiet: list[Stream]
) -> dict[str, Any] | None:
    """The longest silence of the streams in flight on a replica when it was stopped:
    those mid-answer, and those waiting for their first token."""
    hangs = [w for w in windows if w.kind == "hang"]
    if not hangs:
        return None
    mid: list[float] = []
    waiting: list[float] = []
    for w in hangs:
        for s in sent:
            if s.replica == w.replica and s.started_s < w.start_s < s.ended_s:
                times = [s.started_s, *s.token_s, s.ended_s]
                gaps = [b - a for a, b in itertools.pairwise(times) if b > w.start_s]
                begun = bool(s.token_s) and s.token_s[0] < w.start_s
                (mid if begun else waiting).append(max(gaps, default=0.0))
    ttfts = [t for s in quiet if (t := s.ttft_s) is not None]
    ttft = statistics.median(ttfts) if ttfts else 0.0
    return {
        "mid_answer": len(mid),
        "max_silence_s": max(mid, default=0.0),
        "bound_s": stall_timeout_s + ttft,
        "waiting": len(waiting),
        "waiting_max_silence_s": max(waiting, default=0.0),
    }


def _overlaps(s: Stream, w: Window) -> bool:
    return s.started_s < w.end_s + SETTLE_S and s.ended_s > w.start_s


def p99(streams: list[Stream], what: str) -> float | None:
    values = sorted(v for s in streams if (v := getattr(s, what)) is not None)
    if not values:
        return None
    return 1000 * values[min(len(values) - 1, int(0.99 * len(values)))]


def _row(s: Stream, max_tokens: int, windows: list[Window]) -> dict[str, Any]:
    """One stream, with when it ran (seconds on the run's monotonic clock, as the faults'
    windows) and its longest gap between two events: where a slow stream's time went."""
    gaps = [b - a for a, b in itertools.pairwise(s.token_s)]
    return {"index": s.index, "chat": s.chat, "replica": s.replica, "events": len(s.token_s),
            "completion_tokens": s.completion_tokens, "finishes": s.finishes, "dones": s.dones,
            "verdict": s.verdict(max_tokens), "ttft_s": s.ttft_s, "tpot_s": s.tpot_s,
            "started_s": s.started_s, "ended_s": s.ended_s,
            "longest_gap_s": max(gaps, default=None),
            "faulted": any(_overlaps(s, w) for w in windows), "error": s.error}  # fmt: skip


def table(r: dict[str, Any]) -> str:
    def ms(pair: dict[str, float | None]) -> str:
        return " / ".join("-" if v is None else f"{v:,.0f}" for v in pair.values())

    a = r["args"]
    kinds = ", ".join(f"{w['kind']} {w['replica']}" for w in r["faults"])
    lines = [
        f"chaos run {r['date']}: {a['replicas']} {a['engine']} replicas, {a['streams']} streams "
        f"x {a['max_tokens']} tokens, concurrency {a['concurrency']}, seed {a['seed']}, "
        f"{len(r['faults'])} faults ({kinds}); {r['elapsed_s']:.0f} s",
        "",
        "| sent | completed | continued | failed | duplicated | refused, retried | cut, retried |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['sent']} | {r['completed']} | {r['continued']} | {r['failed']} | "
        f"{r['duplicated']} | {r['refused']} | {r['cut']} |",
        "(refused: a 502/503 before any token, no replica ready; cut: the gateway was down)",
        "",
        f"TTFT p99 quiet / faulted: {ms(r['ttft_p99_ms'])} ms; "
        f"TPOT p99 quiet / faulted: {ms(r['tpot_p99_ms'])} ms",
    ]
    if (hang := r["hang"]) is not None:
        over = hang["max_silence_s"] - hang["bound_s"]
        verdict = "within" if over <= 0 else f"{over:.2f} s over"
        lines.append(
            f"hang: {hang['mid_answer']} streams mid-answer on the stopped replica, longest "
            f"silence {hang['max_silence_s']:.2f} s ({verdict} the issue's bound "
            f"{hang['bound_s']:.2f} s, stall deadline + TTFT p50 of the quiet streams; the "
            "watchdog acts within the deadline of a stream's last byte, the rest is the "
            f"continuation's own TTFT); {hang['waiting']} waiting for their first token, "
            f"longest silence {hang['waiting_max_silence_s']:.1f} s"
        )
    if restart := r["gateway_restart"]:
        lines.append(
            f"gateway killed: the new one ready after {restart['ready_s']:.2f} s, its first "
            f"stream completed {restart['first_stream_s']:.1f} s after the kill"
        )
    if r["batch"]:
        lines.append(f"batch: {r['batch']}")
    if retried := r.get("starts_retried"):
        lines.append(f"replica starts tried again: {len(retried)} ({'; '.join(retried)})")
    if aborted := r.get("aborted"):
        lines.append(f"NOT A FULL RUN, faults stopped: {aborted}")
    return "\n".join(lines)
