"""Seed 004's troubleshooting table as rules: each a pure function of the evidence returning
its findings. `diagnose` runs them all, the problems first."""

from __future__ import annotations

from collections.abc import Callable

from servepilot.observe.doctor.env_rules import cpu_features, placement_groups, shm_size
from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.finding import Finding, Severity
from servepilot.observe.doctor.kv_rules import kv_events_flow
from servepilot.observe.doctor.latency_rules import high_ttft, low_batch_utilisation, p99_spikes
from servepilot.observe.doctor.memory_rules import kv_near_full, oom, preemptions
from servepilot.observe.doctor.metric_names import metric_names
from servepilot.observe.doctor.topology import gpu_topology

Rule = Callable[[Evidence], list[Finding]]

RULES: tuple[Rule, ...] = (
    oom,
    preemptions,
    kv_near_full,
    high_ttft,
    p99_spikes,
    low_batch_utilisation,
    metric_names,
    kv_events_flow,
    shm_size,
    cpu_features,
    gpu_topology,
    placement_groups,
)
_ORDER = {Severity.PROBLEM: 0, Severity.WARNING: 1, Severity.INFO: 2}


def diagnose(evidence: Evidence) -> tuple[Finding, ...]:
    findings = [finding for rule in RULES for finding in rule(evidence)]
    return tuple(sorted(findings, key=lambda f: _ORDER[f.severity]))
