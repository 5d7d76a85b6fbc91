"""The columns of the run table, shared by the HTML report and the console.

Defined once so the terminal and the report cannot drift apart: each column knows its
header, unit, how to print a run's value and which SLO (if any) that value is held to.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from servepilot.bench.report.fmt import MISSING, fmt_num, fmt_pct, format_load
from servepilot.core.results import Run, Stats


@dataclass(frozen=True)
class Column:
    header: str
    unit: str
    text: Callable[[Run], str]
    value: Callable[[Run], float | None] | None = None
    """The number behind the text, for columns checked against an SLO."""
    slo_key: str | None = None
    """The `--slo` key this column is held to, e.g. `ttft_p99_ms`."""
    alarm: Callable[[Run], bool] | None = None
    """True where the cell must stand out whatever the SLOs (a client-bound run)."""

    def over_slo(self, run: Run, slo: dict[str, float]) -> bool:
        if self.slo_key is None or self.value is None or self.slo_key not in slo:
            return False
        measured = self.value(run)
        return measured is not None and measured > slo[self.slo_key]


def _stat_column(metric: str, pct: str) -> Column:
    def value(run: Run) -> float | None:
        stats: Stats = getattr(run, f"{metric}_ms")
        result: float | None = getattr(stats, pct)
        return result

    return Column(
        f"{metric.upper()} {pct}",
        "ms",
        lambda run: fmt_num(value(run)),
        value,
        f"{metric}_{pct}_ms",
    )


def _rate(run: Run) -> str:
    if run.client is None:
        return MISSING
    achieved = fmt_num(run.client.achieved_rate)
    if run.client.requested_rate is None:  # closed loop: no rate was asked for
        return achieved
    return f"{achieved} / {fmt_num(run.client.requested_rate)}"


def _client(run: Run) -> str:
    if run.client is None:
        return MISSING
    return "client-bound" if run.client.client_bound else "ok"


def _client_bound(run: Run) -> bool:
    return run.client is not None and run.client.client_bound


RUN_COLUMNS: tuple[Column, ...] = (
    Column("Load", "", lambda run: format_load(run.load)),
    Column("Done", "req", lambda run: f"{run.completed:,}"),
    Column("Failed", "req", lambda run: f"{run.failed:,}"),
    Column("Req/s", "req/s", lambda run: fmt_num(run.request_throughput)),
    Column("Out tok/s", "tok/s", lambda run: fmt_num(run.output_throughput)),
    # The server's count (usage.prompt_tokens, mean), not the asked size: on chat it holds
    # the template, and a multi-turn request its earlier turns.
    Column("Server prompt", "tok", lambda run: fmt_num(run.input_tokens_mean)),
    _stat_column("ttft", "p50"),
    _stat_column("ttft", "p99"),
    _stat_column("tpot", "p50"),
    _stat_column("tpot", "p99"),
    _stat_column("itl", "p99"),
    _stat_column("e2e", "p99"),
    Column("Goodput", "req/s", lambda run: fmt_num(run.goodput_rps)),
    Column("SLO met", "%", lambda run: fmt_pct(run.slo_attainment)),
    Column("Rate got/asked", "req/s", _rate),
    Column(
        "Send lag p99",
        "ms",
        lambda run: MISSING if run.client is None else fmt_num(run.client.send_lag_ms.p99),
    ),
    Column("Client", "", _client, alarm=_client_bound),
)


def _p50(stats: Stats | None) -> str:
    return MISSING if stats is None else fmt_num(stats.p50)


TURN_COLUMNS: tuple[Column, ...] = (
    Column("TTFT p50 1st turn", "ms", lambda run: _p50(run.ttft_ms_first_turn)),
    Column("TTFT p50 returning", "ms", lambda run: _p50(run.ttft_ms_returning)),
)
"""multi_turn only: first turns against returning ones, whose history a KV cache (GPU or
CPU tier) may still hold."""


def report_columns(slo: Mapping[str, float], *, turns: bool = False) -> tuple[Column, ...]:
    """RUN_COLUMNS less "SLO met" when no SLO was set: every success then "meets" it, and
    100% would claim a check that was never made; with `turns` (a multi_turn run), the TTFT
    of first and returning turns after the TTFT columns."""
    columns = [c for c in RUN_COLUMNS if slo or c.header != "SLO met"]
    if turns:
        after = next(i for i, c in enumerate(columns) if c.header == "TTFT p99") + 1
        columns[after:after] = TURN_COLUMNS
    return tuple(columns)


def has_turns(runs: Sequence[Run]) -> bool:
    """Whether any run split its TTFT by turn (a multi_turn workload)."""
    return any(run.ttft_ms_first_turn is not None for run in runs)
