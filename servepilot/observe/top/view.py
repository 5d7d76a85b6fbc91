"""What `servepilot top` shows, as plain text tables (cli draws them): the fleet line, a row
per replica and a row per priority class, the latencies over the last minute.

`TopView` keeps the samples of the last minute; percentiles and sheds are the differences
between the newest sample and the one a minute before it. With a single sample (a piped
`top` prints one and exits) they are counted since the gateway started, and say so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from servepilot.core.texttable import TextTable
from servepilot.engine.metrics import Histogram
from servepilot.observe.top.sample import CLASSES, FleetSample
from servepilot.observe.top.window import (
    Percentiles,
    Window,
    counter_delta,
    delta,
    percentiles_ms,
)

REPLICA_COLUMNS = ("replica", "healthy", "in flight", "running", "waiting", "KV", "preempted")
CLASS_COLUMNS = ("class", "queued", "TTFT p50", "TTFT p99", "streams", "shed")
CLASS_NAMES = {"0": "0 interactive", "1": "1 default", "2": "2 batch"}


@dataclass(frozen=True, slots=True)
class Screen:
    """One refresh of the view."""

    headline: str
    replicas: TextTable
    classes: TextTable
    notes: tuple[str, ...]


class TopView:
    def __init__(self, window_s: float = 60.0) -> None:
        self._window: Window[FleetSample] = Window(window_s)
        self._latest: FleetSample | None = None

    def add(self, sample: FleetSample) -> None:
        self._window.add(sample.at_s, sample)
        self._latest = sample

    def screen(self, gateway_url: str) -> Screen:
        latest = self._latest
        if latest is None:
            raise ValueError("no sample yet")
        ends = self._window.ends()
        base = ends[0] if ends is not None else None
        span = self._window.span_s()
        label = f"last {span:.0f} s" if base is not None else "since the gateway started"
        ttft = {
            c: _recent(latest.ttft_by_class[c], base.ttft_by_class[c] if base else None)
            for c in CLASSES
        }
        tpot = percentiles_ms(_recent(latest.tpot, base.tpot if base else None))
        sheds = _increase(latest.sheds_total, base.sheds_total if base else {})
        return Screen(
            headline=headline(gateway_url, latest, tpot, label),
            replicas=replica_table(latest),
            classes=class_table(latest, ttft, _shed(latest, base), label),
            notes=(*_shed_note(sheds, label), *latest.problems),
        )


def _shed(latest: FleetSample, base: FleetSample | None) -> dict[str, float]:
    return _increase(latest.sheds_by_class, base.sheds_by_class if base else {})


def _increase(newest: Mapping[str, float], baseline: Mapping[str, float]) -> dict[str, float]:
    return {key: counter_delta(value, baseline.get(key, 0.0)) for key, value in newest.items()}


def _recent(newest: Histogram, baseline: Histogram | None) -> Histogram:
    return newest if baseline is None else delta(newest, baseline)


def headline(url: str, sample: FleetSample, tpot: Percentiles, label: str) -> str:
    healthy = sum(1 for r in sample.replicas if r.healthy and r.sleep == "awake")
    pool = "".join(f", {n} {state}" for state in ("asleep", "parked")
                   if (n := sum(1 for r in sample.replicas if r.sleep == state)))  # fmt: skip
    in_flight = sum(r.in_flight for r in sample.replicas)
    parts = [
        f"{url}: {healthy} of {len(sample.replicas)} replicas healthy{pool}",
        f"{in_flight} in flight",
        f"TPOT p50 {fmt_ms(tpot.p50_ms)}, p99 {fmt_ms(tpot.p99_ms)} ({label})",
    ]
    if sample.desired_replicas is not None:
        wanted = sample.desired_replicas
        parts.append(f"autoscaler wants {wanted:g} replica{'' if wanted == 1 else 's'}")
    if sample.degradation_level:
        parts.append(f"degraded to level {sample.degradation_level}")
    return " · ".join(parts)


def replica_table(sample: FleetSample) -> TextTable:
    rows = tuple(
        (
            r.replica_id,
            r.sleep if r.sleep != "awake" else "yes" if r.healthy else "NO",
            str(r.in_flight),
            str(r.running),
            str(r.waiting),
            f"{100 * r.kv_cache_usage:.0f}%",
            "—" if r.preemptions_total is None else f"{r.preemptions_total:,.0f}",
        )
        for r in sample.replicas
    )
    return TextTable(
        "replicas",
        REPLICA_COLUMNS,
        rows,
        right=REPLICA_COLUMNS[2:],
        caption="preempted: vLLM's preemptions since the replica started",
    )


def class_table(
    sample: FleetSample, ttft: Mapping[str, Histogram], shed: Mapping[str, float], label: str
) -> TextTable:
    rows = []
    for cls in CLASSES:
        stats = percentiles_ms(ttft[cls])
        rows.append(
            (
                CLASS_NAMES[cls],
                str(sample.queue_depth.get(cls, 0)),
                fmt_ms(stats.p50_ms),
                fmt_ms(stats.p99_ms),
                f"{stats.count:,}",
                f"{shed.get(cls, 0.0):,.0f}",
            )
        )
    return TextTable(
        f"priority classes ({label}; TTFT at the gateway, queue wait included)",
        CLASS_COLUMNS,
        tuple(rows),
        right=CLASS_COLUMNS[1:],
    )


def _shed_note(sheds: dict[str, float], label: str) -> tuple[str, ...]:
    shed = {reason: count for reason, count in sheds.items() if count > 0}
    if not shed:
        return (f"no request shed ({label})",)
    listed = ", ".join(f"{reason} {count:,.0f}" for reason, count in sorted(shed.items()))
    return (f"shed ({label}): {listed}",)


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"
