"""doctor names the replicas whose KV events do not reach the gateway."""

from __future__ import annotations

from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.rules import diagnose

PAGE = """\
# HELP servepilot_prefix_index_exact 1 where the replica's KV events flow
# TYPE servepilot_prefix_index_exact gauge
servepilot_prefix_index_exact{replica="r0"} 1.0
servepilot_prefix_index_exact{replica="r2"} 0.0
"""


def test_a_replica_whose_events_do_not_flow_is_named() -> None:
    found = [f for f in diagnose(Evidence(gateway_metrics=PAGE)) if f.rule == "kv_events"]
    assert [f.summary for f in found] == ["KV events are not flowing from r2"]
    assert found[0].knob == "engine.kv_events"


def test_a_gateway_without_an_exact_index_draws_no_finding() -> None:
    page = "# TYPE servepilot_requests counter\nservepilot_requests_total 3.0\n"
    assert not [f for f in diagnose(Evidence(gateway_metrics=page)) if f.rule == "kv_events"]
