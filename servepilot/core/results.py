"""The result schema `servepilot.bench/v1`, written by `bench` (measured) and `sim` (simulated).

One schema for both, so a prediction and a measurement of the same load can be diffed by a
program (`servepilot bench compare`). Times are in milliseconds, rates per second.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servepilot.core.errors import ConfigError

SCHEMA: Literal["servepilot.bench/v1"] = "servepilot.bench/v1"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Source(enum.StrEnum):
    MEASURED = "measured"
    SIMULATED = "simulated"


class LoadMode(enum.StrEnum):
    CONCURRENCY = "concurrency"
    """Closed loop: this many requests in flight at all times."""
    RATE = "rate"
    """Open loop: requests sent at this many per second on a fixed schedule."""


class Load(_Record):
    mode: LoadMode
    value: float


class Stats(_Record):
    """Summary of one latency metric over a run's requests (ms); None where no sample."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    count: int = 0


class Window(_Record):
    """One window of a soak run."""

    start_s: float
    end_s: float
    completed: int
    failed: int
    request_throughput: float
    output_throughput: float
    ttft_p99_ms: float | None
    e2e_p99_ms: float | None
    resident_memory_bytes: int | None = None
    memory_by_source_bytes: dict[str, int] = Field(default_factory=dict)
    """Memory of each source sampled at the window's end, beyond the target's /metrics: each
    process of a local fleet's replicas (`r0 VLLM::EngineCor (pid 1234)`) and each GPU's
    used memory (`gpu0`)."""


class ClientHealth(_Record):
    """How well the load generator kept to its schedule (its own honesty report)."""

    requested_rate: float | None
    achieved_rate: float
    send_lag_ms: Stats
    """Actual send time minus intended send time."""
    client_bound: bool
    """True when the client, not the server, limited the load."""
    processes: int = 1


class Run(_Record):
    load: Load
    duration_s: float
    completed: int
    failed: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft_ms: Stats
    tpot_ms: Stats
    itl_ms: Stats
    e2e_ms: Stats
    goodput_rps: float
    """Requests per second that met every SLO (all completed ones when no SLO is set)."""
    ttft_ms_first_turn: Stats | None = None
    """multi_turn workloads: TTFT of the conversations' first turns; None otherwise."""
    ttft_ms_returning: Stats | None = None
    """multi_turn workloads: TTFT of the returning turns (the second and later), whose
    history the server may still hold as cached KV (on the GPU, or in a CPU tier) and
    otherwise prefills again; None otherwise."""
    slo_attainment: float
    """Share of requests (failed ones included) that met every SLO."""
    slo_met: bool | None = None
    """Whether the level's statistics met the SLO's level limits (itl_*, p50/p90/mean ones;
    core/slo.py); None when the SLO sets none."""
    slo_violated: tuple[str, ...] = ()
    """The keys of the level limits this level missed, e.g. `itl_p99_ms`."""
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    errors: dict[str, int] = Field(default_factory=dict)
    """Failed requests by reason."""
    client: ClientHealth | None = None
    windows: tuple[Window, ...] = ()
    memory_growth_bytes_per_request: float | None = None
    """Soak only: the target's resident memory growth divided by requests served."""
    memory_growth_by_source_bytes_per_request: dict[str, float] = Field(default_factory=dict)
    """Soak only: the same for each source of the windows' memory_by_source_bytes."""
    refused: int = 0
    """Of `failed`: requests the server shed (429, or 503 with Retry-After)."""
    retry_wait_s: float = 0.0
    """Closed loop: time the workers waited out Retry-After before their next request
    (all workers together), instead of re-sending at once."""
    peak_in_flight: int | None = None
    """The most requests in flight at once (measured runs)."""
    load_reached: bool = True
    """False when the level never ran at its load (fewer requests than its concurrency, or
    a rate the client could not keep): such a level is never the sweet spot."""
    prefix_cache_hit_rate: float | None = None
    """Of the prompt tokens the replicas looked up during the level, the share their prefix
    cache held (vLLM's prefix_cache_hits / prefix_cache_queries; simulated: the same counts);
    None where the server exports no such counters."""


class SweetSpot(_Record):
    load: Load
    reason: str


class BenchResult(_Record):
    schema_: Literal["servepilot.bench/v1"] = Field(default=SCHEMA, alias="schema")
    source: Source
    target: dict[str, Any]
    workload: dict[str, Any]
    slo: dict[str, float] = Field(default_factory=dict)
    runs: tuple[Run, ...]
    sweet_spot: SweetSpot | None = None
    interrupted: bool = False
    """The run was stopped (Ctrl-C) before its last level: `runs` holds the finished ones."""

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json", by_alias=True), indent=2)


def load_result(path: Path) -> BenchResult:
    """Read a results.json; errors name the file and what is wrong."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ConfigError(f"{path}: not a {SCHEMA} result (its `schema` field says otherwise)")
    try:
        return BenchResult.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{path}: {where}: {first['msg']}") from None
