"""The Grafana dashboard of a fleet, as a plain dict (Grafana's JSON model, schema 39).

Rows: fleet overview, latency, per replica, per priority class, then GPUs and the autoscaler
only where the fleet exports them: a panel whose series cannot exist would sit empty, which is
the bug users of other stacks report (production-stack#379). Every query is tested against a
real Prometheus scraping a real fleet.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from servepilot.core.config import Device, FleetConfig
from servepilot.observe.promql import (
    INFERENCE_ROUTES,
    prefix_hit_rate,
    quantile,
    request_rate,
    shed_rate,
)

WINDOW = "1m"
"""Rate window of the panels: four samples at Prometheus's default 15 s scrape interval."""
_DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
_WIDTH = 24
_PANEL_W, _PANEL_H = 8, 8


@dataclass(frozen=True, slots=True)
class Target:
    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    unit: str
    """Grafana's unit id: s, percentunit, reqps, currencyUSD, bytes, short."""
    targets: tuple[Target, ...]
    description: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True, slots=True)
class Features:
    """What the fleet exports beyond the gateway's and vLLM's own series."""

    gpu: bool
    """servepilot_gpu_* (NVML): only on GPU hosts."""
    autoscale: bool
    """servepilot_autoscale_*: only while the autoscaler runs."""


def features_of(config: FleetConfig) -> Features:
    return Features(gpu=config.hardware.device is Device.GPU, autoscale=config.autoscale.enabled)


def _latencies(title: str, histogram: str, scope: str = "") -> Panel:
    targets = tuple(
        Target(quantile(q, histogram, WINDOW, scope=scope), f"p{round(q * 100)}")
        for q in (0.5, 0.9, 0.99)
    )
    return Panel(title, "s", targets)


def _fleet_row(features: Features) -> Row:
    replicas = [Target("sum(servepilot_replica_healthy)", "ready")]
    if features.autoscale:
        replicas += [
            Target("servepilot_autoscale_desired_replicas", "desired (autoscaler)"),
            Target("servepilot_autoscale_current_replicas", "current (autoscaler)"),
        ]
    return Row("Fleet overview", (
        Panel("Request rate by status", "reqps", (Target(request_rate(WINDOW), "{{code}}"),)),
        Panel("Replicas", "short", tuple(replicas)),
        Panel("Batch utilisation (running / max_num_seqs)", "percentunit",
              (Target("servepilot_fleet_batch_utilization", "fleet"),),
              "Below 70% for 5 minutes the batch is underfilled: raise max_num_seqs or "
              "consolidate replicas."),
        Panel("Cost per QPS (USD per hour per request/s)", "currencyUSD", (
            Target("servepilot_cost_usd_per_qps_hour", "USD/h per QPS"),
            Target("servepilot_fleet_cost_usd_per_hour", "fleet USD/h"),
        ), "Fleet dollars per hour / sustained QPS over 5 minutes; the alert's line is $0.1."),
        Panel("Sheds by reason", "reqps", (Target(shed_rate(WINDOW), "{{reason}}"),)),
        Panel("KV cache usage, fullest replica", "percentunit",
              (Target("max(vllm:kv_cache_usage_perc)", "max"),)),
    ))  # fmt: skip


def _latency_row() -> Row:
    return Row("Latency (vLLM, all replicas)", (
        _latencies("TTFT", "vllm:time_to_first_token_seconds"),
        _latencies("TPOT", "vllm:request_time_per_output_token_seconds"),
        _latencies("ITL", "vllm:inter_token_latency_seconds"),
        _latencies("E2E", "vllm:e2e_request_latency_seconds"),
        _latencies("TTFT at the gateway (queue wait included)", "servepilot_ttft_seconds",
                   INFERENCE_ROUTES),
        _latencies("E2E at the gateway (queue wait included)", "servepilot_e2e_seconds",
                   INFERENCE_ROUTES),
    ))  # fmt: skip


def _replica_row() -> Row:
    inst = "{{instance}}"
    return Row("Per replica", (
        Panel("Requests running / waiting in vLLM", "short", (
            Target("sum by (instance) (vllm:num_requests_running)", f"{inst} running"),
            Target("sum by (instance) (vllm:num_requests_waiting)", f"{inst} waiting"),
        )),
        Panel("Batch utilisation", "percentunit",
              (Target("servepilot_batch_utilization", "{{replica}}"),)),
        Panel("KV cache usage", "percentunit",
              (Target("max by (instance) (vllm:kv_cache_usage_perc)", inst),)),
        Panel("Preemptions per second", "short", (Target(
            f"sum by (instance) (rate(vllm:num_preemptions_total[{WINDOW}]))", inst),)),
        Panel("Prefix cache hit rate", "percentunit", (Target(prefix_hit_rate(WINDOW), inst),)),
        Panel("TTFT p99", "s", (Target(
            quantile(0.99, "vllm:time_to_first_token_seconds", WINDOW, "instance"), inst),)),
        Panel("In flight (gateway)", "short",
              (Target("servepilot_in_flight_requests", "{{replica}}"),)),
    ))  # fmt: skip


def _class_row() -> Row:
    cls_ = "P{{class}}"
    return Row("Per priority class (0 interactive, 1 default, 2 batch)", (
        Panel("Requests sent to replicas by class", "reqps", (Target(
            f"sum by (class) (rate(servepilot_upstream_requests_total[{WINDOW}]))", cls_),)),
        Panel("TTFT p99 at the gateway by class", "s", (Target(
            quantile(0.99, "servepilot_ttft_seconds", WINDOW, "class", INFERENCE_ROUTES),
            cls_),)),
        Panel("Gateway queue depth by class", "short",
              (Target("sum by (class) (servepilot_queue_depth)", cls_),)),
        Panel("Gateway queue wait p99 by class", "s", (Target(
            quantile(0.99, "servepilot_queue_wait_seconds", WINDOW, "class"), cls_),)),
        Panel("Sheds by class and reason", "reqps",
              (Target(shed_rate(WINDOW, "class, reason"), f"{cls_} {{{{reason}}}}"),)),
    ))  # fmt: skip


def _gpu_row() -> Row:
    return Row("GPUs (NVML, on the gateway's host)", (
        Panel("GPU utilisation", "percentunit",
              (Target("servepilot_gpu_utilization", "GPU {{gpu}}"),),
              "Pegged near 100% is normal while batching; act when latency rises too."),
        Panel("GPU memory used", "percentunit", (Target(
            "servepilot_gpu_memory_used_bytes / servepilot_gpu_memory_total_bytes",
            "GPU {{gpu}}"),)),
    ))  # fmt: skip


def _autoscale_row() -> Row:
    return Row("Autoscaler", (
        Panel("Decisions per minute", "short", (Target(
            "sum by (direction) (increase(servepilot_autoscale_decisions_total[5m])) / 5",
            "{{direction}}"),)),
    ))  # fmt: skip


def rows(features: Features) -> tuple[Row, ...]:
    out = [_fleet_row(features), _latency_row(), _replica_row(), _class_row()]
    if features.gpu:
        out.append(_gpu_row())
    if features.autoscale:
        out.append(_autoscale_row())
    return tuple(out)


def queries(features: Features) -> list[str]:
    """Every PromQL expression the dashboard runs."""
    return [t.expr for row in rows(features) for p in row.panels for t in p.targets]


def dashboard(config: FleetConfig, title: str = "servepilot fleet") -> dict[str, Any]:
    """Grafana's dashboard JSON for the fleet `config` describes."""
    return {
        "title": title,
        "uid": "servepilot-fleet",
        "tags": ["servepilot", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "10s",
        "templating": {"list": [_datasource_variable()]},
        "panels": list(_grafana_panels(rows(features_of(config)))),
    }


def _grafana_panels(all_rows: tuple[Row, ...]) -> Iterator[dict[str, Any]]:
    y, panel_id = 0, 1
    for row in all_rows:
        yield {"type": "row", "id": panel_id, "title": row.title, "collapsed": False,
               "gridPos": {"h": 1, "w": _WIDTH, "x": 0, "y": y}, "panels": []}  # fmt: skip
        panel_id, y = panel_id + 1, y + 1
        per_line = _WIDTH // _PANEL_W
        for i, panel in enumerate(row.panels):
            x = (i % per_line) * _PANEL_W
            at = {"h": _PANEL_H, "w": _PANEL_W, "x": x, "y": y + (i // per_line) * _PANEL_H}
            yield _timeseries(panel, panel_id, at)
            panel_id += 1
        y += -(-len(row.panels) // per_line) * _PANEL_H


def _timeseries(panel: Panel, panel_id: int, grid: dict[str, int]) -> dict[str, Any]:
    return {
        "type": "timeseries",
        "id": panel_id,
        "title": panel.title,
        "description": panel.description,
        "datasource": _DATASOURCE,
        "gridPos": grid,
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        "options": {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "none"},
        },
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": _DATASOURCE,
                "expr": t.expr,
                "legendFormat": t.legend,
                "range": True,
            }
            for i, t in enumerate(panel.targets)
        ],
    }


def _datasource_variable() -> dict[str, Any]:
    return {"name": "datasource", "label": "Prometheus", "type": "datasource",
            "query": "prometheus", "current": {}, "hide": 0}  # fmt: skip
