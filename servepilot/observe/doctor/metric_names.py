"""Renamed and missing vLLM metrics: what a dashboard, alert or router reading the wrong name
sees is an empty panel or a 0, never an error (production-stack#379)."""

from __future__ import annotations

from servepilot.engine.metrics import EngineMetric, Scrape
from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.finding import Finding, Severity

CORE = (EngineMetric.RUNNING, EngineMetric.WAITING, EngineMetric.KV_CACHE_USAGE, EngineMetric.TTFT)
"""What every tool that watches vLLM reads; a page without them is not watched."""
REMOVED = (
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_queries",
    "vllm:gpu_prefix_cache_hits",
    "vllm:time_per_output_token_seconds",
)


def metric_names(evidence: Evidence) -> list[Finding]:
    found = []
    for replica in evidence.replicas:
        if replica.metrics is None:
            continue
        page = evidence.pages().get(replica.replica_id)
        found += _page_findings(replica.replica_id, page)
    return _once(found)


def _page_findings(replica_id: str, page: Scrape | None) -> list[Finding]:
    if page is None or not page.is_vllm():
        return [
            Finding(
                "metric_names",
                Severity.PROBLEM,
                f"{replica_id}'s /metrics holds no vLLM metric",
                evidence=f"{replica_id}: no vllm:* or ray_vllm_* series",
                fix="check that the replica is vLLM and that its metrics are not "
                "disabled (--disable-log-stats)",
            )
        ]
    found = []
    missing = [m.families[0] for m in CORE if not page.has(m)]
    if missing:
        found.append(
            Finding(
                "metric_names",
                Severity.WARNING,
                f"{replica_id} lacks metrics every vLLM dashboard reads",
                evidence=f"{replica_id}: no {', '.join(missing)} in any naming",
                fix="upgrade vLLM (0.11 or later) or read the names it exports",
            )
        )
    naming = _naming_finding(replica_id, page.family(EngineMetric.KV_CACHE_USAGE) or "")
    if naming is not None:
        found.append(naming)
    return found


def _naming_finding(replica_id: str, family: str) -> Finding | None:
    """Which naming the KV cache usage comes in (`family`: "" when it is absent): Ray's
    exporter's, an old vLLM's, or today's (whose dropped names other tools may still read)."""
    if family.startswith("ray_"):
        return Finding(
            "metric_names",
            Severity.INFO,
            "vLLM's metrics come through Ray's exporter as ray_vllm_*",
            evidence=f"{replica_id}: {family}",
            fix="query ray_vllm_* (a vllm:* query finds nothing); set "
            "RAY_EXPORT_COUNTER_AS_GAUGE=0 so counters are not exported "
            "twice",
        )
    if family in REMOVED:
        return Finding(
            "metric_names",
            Severity.WARNING,
            "old vLLM: it exports names that current dashboards no longer read",
            evidence=f"{replica_id}: {family}",
            fix="upgrade vLLM to 0.11 or later (vllm:kv_cache_usage_perc, "
            "vllm:prefix_cache_*), or make dashboards read both names",
        )
    if family:
        return Finding(
            "metric_names",
            Severity.INFO,
            "vllm:gpu_cache_usage_perc and gpu_prefix_cache_* are gone: tools "
            "still reading them show 0",
            evidence=f"{replica_id}: {family}, no {REMOVED[0]}",
            fix="point dashboards, alerts and routers at "
            "vllm:kv_cache_usage_perc and vllm:prefix_cache_*_total; TPOT is "
            "vllm:request_time_per_output_token_seconds (the old name is "
            "gone since 0.13)",
        )
    return None


def _once(findings: list[Finding]) -> list[Finding]:
    """One finding per (severity, summary) across replicas: eight replicas of the same vLLM
    are one fact; the evidence names the first."""
    seen: dict[tuple[Severity, str], Finding] = {}
    for finding in findings:
        key = (finding.severity, finding.summary.split("'s ", 1)[-1])
        seen.setdefault(key, finding)
    return list(seen.values())
