"""The rendered alert rules under promtool: `check rules`, and a `test rules` unit test per
alert that fires it just past its threshold once its `for:` window has passed, not before, and
never at the threshold. Series are named and labelled as the gateway and vLLM 0.32 export them
(tests/fixtures/vllm/metrics_after_requests.txt is a real vLLM page)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from servepilot.core.config import FleetConfig
from servepilot.observe import alert_rules
from servepilot.observe.alerts import rules
from servepilot.observe.promql import INFERENCE_ROUTES

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool missing: `make prometheus` installs Debian's prometheus"
)
VLLM_PAGE = Path(__file__).parents[1] / "fixtures" / "vllm" / "metrics_after_requests.txt"
CONFIG = FleetConfig.model_validate(
    {
        "hardware": {"device": "gpu", "accelerator": "h100-80", "count": 8},
        "slo": {"ttft_p99_ms": 500},
    }
)
GW = 'instance="127.0.0.1:8080",job="servepilot"'
R0 = 'instance="127.0.0.1:8001",job="vllm"'
VLLM = f'engine="0",model_name="smollm2",{R0}'
CHAT_ROUTE = 'route="/v1/chat/completions"'


@dataclass(frozen=True)
class Case:
    alert: str
    firing: dict[str, str]
    """Series just past the threshold -> their values (promtool's expanding notation)."""
    below: dict[str, str]
    """The same series at (or just under) the threshold: never fires."""
    quiet_at: str
    fires_at: str
    labels: dict[str, str]
    summary: str


def _histogram(name: str, labels: str, per_bucket: dict[str, str]) -> dict[str, str]:
    return {f'{name}_bucket{{{labels},le="{le}"}}': v for le, v in per_bucket.items()}


CASES = [
    Case("ServepilotNoReadyReplica",
         {f'servepilot_replica_healthy{{replica="r0",{GW}}}': "0x100"},
         {f'servepilot_replica_healthy{{replica="r0",{GW}}}': "1x100"},
         "45s", "1m", {},
         "No replica is in rotation: the gateway answers 503 (or holds requests through a "
         "cold start)."),
    Case("ServepilotBatchUnderfilled",
         {f"servepilot_fleet_batch_utilization{{{GW}}}": "0.69x100"},
         {f"servepilot_fleet_batch_utilization{{{GW}}}": "0.7x100"},
         "4m45s", "5m", {"instance": "127.0.0.1:8080", "job": "servepilot"},
         "Batch utilisation 69% (running / max_num_seqs) has been under 70% for 5 minutes."),
    Case("ServepilotCostPerQpsHigh",
         {f"servepilot_cost_usd_per_qps_hour{{{GW}}}": "0.11x100"},
         {f"servepilot_cost_usd_per_qps_hour{{{GW}}}": "0.1x100"},
         "9m45s", "10m", {"instance": "127.0.0.1:8080", "job": "servepilot"},
         "One QPS costs $0.110 per hour (fleet USD/h over sustained QPS), above the $0.1 "
         "line."),
    # 6 sheds every 15 s from t=0: the rate exists from the second sample (15 s); at 2m15s
    # the 5-minute window holds 54 sheds: 0.18/s.
    Case("ServepilotShedding",
         {f'servepilot_shed_total{{class="2",reason="queue_full",{GW}}}': "0+6x100"},
         {f'servepilot_shed_total{{class="2",reason="queue_full",{GW}}}': "0x100"},
         "2m", "2m15s", {"reason": "queue_full"},
         "The gateway is refusing requests (queue_full) at 0.18/s."),
    Case("ServepilotKvCacheNearFull",
         {f"vllm:kv_cache_usage_perc{{{VLLM}}}": "0.91x100"},
         {f"vllm:kv_cache_usage_perc{{{VLLM}}}": "0.9x100"},
         "4m45s", "5m", {"instance": "127.0.0.1:8001"},
         "KV cache of 127.0.0.1:8001 is 91% full."),
    Case("ServepilotPreempting",
         {f"vllm:num_preemptions_total{{{VLLM}}}": "0+3x100"},
         {f"vllm:num_preemptions_total{{{VLLM}}}": "0x100"},
         "5m", "5m15s", {"instance": "127.0.0.1:8001"},
         "127.0.0.1:8001 preempts 0.20 requests/s."),
    Case("ServepilotRequestsWaiting",
         {f"vllm:num_requests_waiting{{{VLLM}}}": "6x100"},
         {f"vllm:num_requests_waiting{{{VLLM}}}": "5x100"},
         "4m45s", "5m", {"instance": "127.0.0.1:8001"},
         "127.0.0.1:8001 holds 6 requests in vLLM's own queue."),
    # 3.15 MB more every 15 s while one request finishes every 15 s: 3.15 MB per request;
    # 1.95 MB per request stays quiet.
    Case("ServepilotMemoryGrowthPerRequest",
         {f"process_resident_memory_bytes{{{R0}}}": "1e9+3.15e6x100",
          f'vllm:request_success_total{{finished_reason="stop",{VLLM}}}': "0+1x100"},
         {f"process_resident_memory_bytes{{{R0}}}": "1e9+1.95e6x100",
          f'vllm:request_success_total{{finished_reason="stop",{VLLM}}}': "0+1x100"},
         "15m", "15m15s", {"instance": "127.0.0.1:8001"},
         "127.0.0.1:8001's resident memory grows 3.15MB per request (over 2 MB: a leak)."),
    Case("ServepilotGpuSaturated",
         {f'servepilot_gpu_utilization{{gpu="0",{GW}}}': "0.96x100"},
         {f'servepilot_gpu_utilization{{gpu="0",{GW}}}': "0.95x100"},
         "15s", "30s", {"gpu": "0", "instance": "127.0.0.1:8080", "job": "servepilot"},
         "GPU 0 has been over 95% busy for 30 s."),
    # Every answer's TTFT in (0.5 s, 1 s]: p99 = 0.5 + 0.99 x 0.5 = 0.995 s, over 500 ms.
    Case("ServepilotTtftP99OverSla",
         _histogram("servepilot_ttft_seconds", f'{CHAT_ROUTE},class="0",{GW}',
                    {"0.5": "0x100", "1.0": "0+10x100", "+Inf": "0+10x100"}),
         _histogram("servepilot_ttft_seconds", f'{CHAT_ROUTE},class="0",{GW}',
                    {"0.5": "0+10x100", "1.0": "0+10x100", "+Inf": "0+10x100"}),
         "5m", "5m15s", {},
         "TTFT p99 at the gateway is 995ms, over the SLA's 500 ms (fleet.yaml slo.ttft_p99_ms)."),
]  # fmt: skip


def _write_rules(tmp_path: Path, labels: dict[str, str] | None = None) -> Path:
    path = tmp_path / "alerts.yaml"
    path.write_text(yaml.safe_dump(alert_rules(CONFIG, labels), sort_keys=False))
    return path


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)


def _series(values: dict[str, str]) -> list[dict[str, str]]:
    return [{"series": name, "values": v} for name, v in values.items()]


def _in_namespace(values: dict[str, str], namespace: str) -> dict[str, str]:
    return {name.replace("{", f'{{namespace="{namespace}",', 1): v for name, v in values.items()}


def _unit_test(case: Case, rules_file: Path, scoped: bool = False) -> dict[str, Any]:
    """Fires on `case.firing` at `fires_at`, not before; never on `case.below`. `scoped`
    (rules matching namespace="llm"): the same, with the opposite series in another
    namespace beside them, which must not count."""
    firing, below, labels = _series(case.firing), _series(case.below), case.labels
    if scoped:
        firing = _series(_in_namespace(case.firing, "llm") | _in_namespace(case.below, "other"))
        below = _series(_in_namespace(case.below, "llm") | _in_namespace(case.firing, "other"))
        # Alerts that keep their series' labels (job among them) keep the namespace too.
        labels = {**labels, "namespace": "llm"} if "job" in labels else labels
    rule = next(r for r in rules(CONFIG) if r.name == case.alert)
    expected = {
        "exp_labels": {**labels, "severity": rule.severity},
        "exp_annotations": {"summary": case.summary, "description": rule.description},
    }
    never = [{"eval_time": t, "alertname": case.alert, "exp_alerts": []}
             for t in (case.quiet_at, case.fires_at, "20m")]  # fmt: skip
    return {
        "rule_files": [str(rules_file)],
        "evaluation_interval": "15s",
        "tests": [
            {"interval": "15s", "input_series": firing, "alert_rule_test": [
                {"eval_time": case.quiet_at, "alertname": case.alert, "exp_alerts": []},
                {"eval_time": case.fires_at, "alertname": case.alert, "exp_alerts": [expected]},
            ]},
            {"interval": "15s", "input_series": below, "alert_rule_test": never},
        ],
    }  # fmt: skip


def test_promtool_checks_the_rendered_rules(tmp_path: Path) -> None:
    done = _promtool("check", "rules", str(_write_rules(tmp_path)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(CASES)} rules found" in done.stdout


def test_every_rendered_alert_has_a_case() -> None:
    assert sorted(r.name for r in rules(CONFIG)) == sorted(c.alert for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.alert)
def test_the_alert_fires_past_its_threshold_after_its_window(tmp_path: Path, case: Case) -> None:
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(_unit_test(case, _write_rules(tmp_path))))
    done = _promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.alert)
def test_rules_matching_a_namespace_read_only_its_series(tmp_path: Path, case: Case) -> None:
    test_file = tmp_path / "test.yaml"
    rules_file = _write_rules(tmp_path, {"namespace": "llm"})
    test_file.write_text(yaml.safe_dump(_unit_test(case, rules_file, scoped=True)))
    done = _promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_matcher_is_in_every_selector() -> None:
    scoped = alert_rules(CONFIG, {"namespace": "llm"})["groups"][0]["rules"]
    plain = alert_rules(CONFIG)["groups"][0]["rules"]
    for rule, bare in zip(scoped, plain, strict=True):
        # Every metric name of the rule (a selector) opens a matcher list holding the namespace.
        names = re.findall(r"(?:vllm:|servepilot_|process_)[a-z_]+", bare["expr"])
        assert rule["expr"].count('namespace="llm"') == len(names), rule["expr"]
        unscoped = re.sub(
            r'\{namespace="llm"\}|namespace="llm",|,namespace="llm"', "", rule["expr"]
        )
        assert unscoped == bare["expr"]


def test_the_ttft_alert_reads_the_inference_routes_only() -> None:
    (sla,) = [r for r in rules(CONFIG) if r.name == "ServepilotTtftP99OverSla"]
    assert f"servepilot_ttft_seconds_bucket{{{INFERENCE_ROUTES}}}" in sla.expr


def test_an_empty_pool_is_no_ready_replica(tmp_path: Path) -> None:
    """A gateway whose pool is empty exports no servepilot_replica_healthy series at all."""
    case = next(c for c in CASES if c.alert == "ServepilotNoReadyReplica")
    empty = replace(case, firing={f'servepilot_requests_total{{code="200",{GW}}}': "0x100"})
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump(_unit_test(empty, _write_rules(tmp_path))))
    done = _promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_series_names_are_vllm_032s() -> None:
    page = VLLM_PAGE.read_text()
    for case in CASES:
        for series in case.firing:
            name = series.split("{")[0].removesuffix("_bucket")
            if name.startswith("vllm:"):
                assert f"\n{name}" in page, name


def test_vllms_example_preemption_alert_never_fires(tmp_path: Path) -> None:
    """vLLM's example rule reads `vllm:num_preemptions`, which is exported as `..._total`: on
    the same preempting replica as above it stays silent, where ServepilotPreempting fires."""
    upstream = tmp_path / "upstream.yaml"
    upstream.write_text(yaml.safe_dump({"groups": [{"name": "vllm", "rules": [
        {"alert": "VLLMPreemptions", "expr": "rate(vllm:num_preemptions[5m]) > 0", "for": "5m"},
    ]}]}))  # fmt: skip
    preempting = next(c for c in CASES if c.alert == "ServepilotPreempting").firing
    test_file = tmp_path / "test.yaml"
    test_file.write_text(yaml.safe_dump({
        "rule_files": [str(upstream)], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": _series(preempting), "alert_rule_test": [
            {"eval_time": "20m", "alertname": "VLLMPreemptions", "exp_alerts": []}]}],
    }))  # fmt: skip
    done = _promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr


def test_no_slo_no_sla_alert_and_no_gpu_alert_on_cpu() -> None:
    names = {r.name for r in rules(FleetConfig())}
    assert "ServepilotTtftP99OverSla" not in names
    assert "ServepilotGpuSaturated" not in names
