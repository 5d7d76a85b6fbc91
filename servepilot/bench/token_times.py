"""`bench --token-times`: when every streamed token of every request arrived.

requests.csv keeps a request's TTFT, TPOT and E2E; the tokens' own arrival times are what a
stall inside a stream is read from (an engine step that took long shows as the same gap in
every stream it served). One JSON object a line, gzipped: the level (`load_mode`,
`load_value`), the request's `index`, `warmup`, and `sent_s` and `chunk_s` (each content
chunk's arrival) in seconds on the run's monotonic clock, to the microsecond. Only when asked:
a long run writes millions of them.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

from servepilot.bench.records import RequestRecord
from servepilot.core.results import Load

FILE_NAME = "token_times.jsonl.gz"


def write_token_times(path: Path, records: Iterable[tuple[Load, RequestRecord]]) -> None:
    with gzip.open(path, "wt", encoding="utf-8") as out:
        for load, record in records:
            line = {
                "load_mode": load.mode.value,
                "load_value": load.value,
                "index": record.index,
                "warmup": record.warmup,
                "sent_s": round(record.sent_s, 6),
                "chunk_s": [round(t, 6) for t in record.chunk_s],
            }
            out.write(json.dumps(line, separators=(",", ":")) + "\n")


def read_token_times(path: Path) -> list[dict[str, object]]:
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]
