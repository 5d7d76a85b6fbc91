"""Replicas whose prefix cache the gateway guesses: their KV events do not reach it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.finding import Finding, Severity

EXACT = "servepilot_prefix_index_exact"


def kv_events_flow(evidence: Evidence) -> list[Finding]:
    """One finding per replica the gateway follows whose events do not flow; none where the
    gateway keeps no exact index (its page has no such series)."""
    text = evidence.gateway_metrics
    if not text:
        return []
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return []
    guessed = sorted(
        sample.labels.get("replica", "?")
        for family in families
        if family.name == EXACT
        for sample in family.samples
        if sample.value == 0
    )
    return [
        Finding(
            "kv_events",
            Severity.WARNING,
            f"KV events are not flowing from {replica}",
            evidence=f'{EXACT}{{replica="{replica}"}} 0 on the gateway\'s /metrics',
            fix=f"routing guesses what {replica} has cached: check that it runs with "
            "--kv-events-config (engine.kv_events) and that its publish and replay ports "
            "(GET /admin/replicas: kv_events, kv_replay) are reachable from the gateway",
            knob="engine.kv_events",
            value="true",
        )
        for replica in guessed
    ]
