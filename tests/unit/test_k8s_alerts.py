"""The PrometheusRule's alerts, run by Prometheus' own promtool: the rules parse, and alerts on
vLLM's current series fire (offline, no server)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.k8s_support import FLEETS, by_kind, fleet, rendered

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is absent")

NS = 'namespace="servepilot"'


def _rules_file(tmp_path: Path) -> Path:
    (rule,) = by_kind(rendered(fleet(FLEETS["embedded"])), "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=60, check=False
    )


def _expect(rules: Path, alert: str, at: str) -> dict[str, Any]:
    """An alert_rule_test: `alert` fires at `at` with its own severity and summary."""
    groups = yaml.safe_load(rules.read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r["alert"] == alert]
    fired = {"exp_labels": rule["labels"], "exp_annotations": rule["annotations"]}
    return {"eval_time": at, "alertname": alert, "exp_alerts": [fired]}


def _run_unit_test(tmp_path: Path, rules: Path, series: list[dict[str, str]],
                   expected: list[dict[str, Any]]) -> None:  # fmt: skip
    unit = {"interval": "1m", "input_series": series, "alert_rule_test": expected}
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [str(rules)], "tests": [unit]}))
    result = _promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_parse(tmp_path: Path) -> None:
    result = _promtool("check", "rules", str(_rules_file(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 7 rules found" in result.stdout


def test_alerts_fire_on_vllms_current_series(tmp_path: Path) -> None:
    rules = _rules_file(tmp_path)
    series = [
        {"series": f'vllm:kv_cache_usage_perc{{{NS},pod="a"}}', "values": "0.97x15"},
        {"series": f'vllm:num_preemptions_total{{{NS},pod="a"}}', "values": "0+3x20"},
        {"series": f'servepilot_replica_healthy{{{NS},replica="r0"}}', "values": "0x10"},
    ]
    expected = [
        _expect(rules, "VllmKvCacheNearlyFull", "10m"),
        _expect(rules, "VllmPreempting", "15m"),
        _expect(rules, "ServepilotNoReadyReplica", "5m"),
    ]
    _run_unit_test(tmp_path, rules, series, expected)


def test_no_replica_at_all_is_no_ready_replica(tmp_path: Path) -> None:
    # A gateway whose pool is empty exports no servepilot_replica_healthy series at all.
    rules = _rules_file(tmp_path)
    series = [{"series": f"servepilot_requests_total{{{NS}}}", "values": "0x5"}]
    _run_unit_test(tmp_path, rules, series, [_expect(rules, "ServepilotNoReadyReplica", "3m")])
