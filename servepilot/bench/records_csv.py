"""Per-request records as CSV: one row per request, the raw material behind every summary.

Latencies follow DESIGN.md: TTFT and E2E are measured from the *intended* send time (an open
loop that falls behind its schedule must not hide the wait), E2E ends at the last content
chunk, TPOT = (E2E - TTFT) / (output_tokens - 1). The CSV holds exactly what results.json
summarises, including its fallback to the count of content chunks when the server reports
no usage. A value that does not exist (no content chunk, a failed request's E2E, TPOT of a
one-token answer) is an empty cell, never 0 or -1, so a spreadsheet's average does not
silently include it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from servepilot.bench.records import RequestRecord
from servepilot.core.results import Load

CSV_COLUMNS = (
    "load_mode",
    "load_value",
    "index",
    "warmup",
    "ok",
    "error",
    "error_detail",
    "intended_s",
    "sent_s",
    "send_lag_ms",
    "ttft_ms",
    "e2e_ms",
    "tpot_ms",
    "n_chunks",
    "input_tokens",
    "output_tokens",
    "replica",
    "turn",
)


def _latencies(record: RequestRecord) -> tuple[float | None, float | None, float | None]:
    """TTFT, E2E and TPOT in ms.

    The same arithmetic as `metrics.request_times` (a test holds them equal), written out
    because building its dataclass per row would double the time a 100k-request CSV takes.
    """
    chunks = record.chunk_s
    if not chunks:
        return None, None, None
    start = record.intended_s
    ttft = (chunks[0] - start) * 1000.0
    if record.error is not None:  # a stream cut mid-way still had a real first token
        return ttft, None, None
    e2e = (chunks[-1] - start) * 1000.0
    tokens = len(chunks) if record.output_tokens is None else record.output_tokens
    return ttft, e2e, (e2e - ttft) / (tokens - 1) if tokens > 1 else None


_NEEDS_QUOTES = frozenset(',"\r\n')


def _text(value: str | None) -> str:
    """A free-text field (error detail, replica id) quoted as RFC 4180 and the csv module do."""
    if not value:
        return ""
    if _NEEDS_QUOTES.isdisjoint(value):
        return value
    return '"' + value.replace('"', '""') + '"'


def _line(prefix: str, record: RequestRecord) -> str:
    # One f-string per row, not csv.writer: half the time for a 100k-request run. Only the
    # free-text fields can hold a delimiter or quote, and `_text` quotes those.
    ttft, e2e, tpot = _latencies(record)
    ok = record.error is None
    return (
        f"{prefix}{record.index},{'true' if record.warmup else 'false'},"
        f"{'true' if ok else 'false'},{_text(record.error)},{_text(record.error_detail)},"
        f"{record.intended_s:.6f},{record.sent_s:.6f},"
        f"{(record.sent_s - record.intended_s) * 1000.0:.3f},"
        f"{'' if ttft is None else f'{ttft:.3f}'},{'' if e2e is None else f'{e2e:.3f}'},"
        f"{'' if tpot is None else f'{tpot:.3f}'},{len(record.chunk_s)},"
        f"{'' if record.input_tokens is None else record.input_tokens},"
        f"{'' if record.output_tokens is None else record.output_tokens},"
        f"{_text(record.replica)},{'' if record.turn is None else record.turn}\n"
    )


def _lines(records: Iterable[tuple[Load, RequestRecord]]) -> Iterator[str]:
    last_load: Load | None = None
    prefix = ""
    for load, record in records:
        if load is not last_load:  # records come run by run: format each load once
            last_load, prefix = load, f"{load.mode.value},{load.value:g},"
        yield _line(prefix, record)


def write_records_csv(path: Path, records: Iterable[tuple[Load, RequestRecord]]) -> None:
    """Write one row per request, in the order given; warm-up rows are kept and flagged."""
    with path.open("w", encoding="utf-8", newline="") as handle:
        handle.write(",".join(CSV_COLUMNS) + "\n")
        handle.writelines(_lines(records))
