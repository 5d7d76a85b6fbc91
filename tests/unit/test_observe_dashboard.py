"""The rendered Grafana dashboard: its panels by what the fleet exports, its layout, every
query parsed by Prometheus's own parser (promtool), and `servepilot observe render`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from servepilot.cli.main import main
from servepilot.core.config import FleetConfig
from servepilot.observe import dashboard
from servepilot.observe.dashboard import Features, features_of, queries
from servepilot.observe.promql import INFERENCE_ROUTES

GPU = FleetConfig.model_validate({"hardware": {"device": "gpu", "accelerator": "h100-80"}})
PROMTOOL = shutil.which("promtool")


def _targets(board: dict[str, object]) -> list[dict[str, str]]:
    panels = board["panels"]
    assert isinstance(panels, list)
    return [t for p in panels for t in p.get("targets", [])]


def test_gpu_panels_only_where_gpus_are() -> None:
    cpu = {t["expr"] for t in _targets(dashboard(FleetConfig()))}
    gpu = {t["expr"] for t in _targets(dashboard(GPU))}
    assert not [q for q in cpu if "servepilot_gpu_" in q]
    assert {q for q in gpu - cpu} == {
        "servepilot_gpu_utilization",
        "servepilot_gpu_memory_used_bytes / servepilot_gpu_memory_total_bytes",
    }


def test_autoscaler_panels_only_when_it_runs() -> None:
    assert features_of(FleetConfig()) == Features(gpu=False, autoscale=False)
    scaled = FleetConfig.model_validate({"autoscale": {"enabled": True, "max_replicas": 4}})
    assert features_of(scaled) == Features(gpu=False, autoscale=True)
    quiet = queries(Features(gpu=False, autoscale=False))
    scaling = queries(Features(gpu=False, autoscale=True))
    assert not [q for q in quiet if "autoscale" in q]
    assert "servepilot_autoscale_desired_replicas" in scaling


def test_latencies_are_quantiles_of_histogram_rates_never_lifetime_means() -> None:
    every = queries(Features(gpu=True, autoscale=True))
    assert not [q for q in every if re.search(r"_(sum|count)\b", q)]
    ttft = [q for q in every if "vllm:time_to_first_token_seconds" in q]
    assert (
        "histogram_quantile(0.99, sum by (le) "
        "(rate(vllm:time_to_first_token_seconds_bucket[1m])))" in ttft
    )
    # vLLM's current KV name, not the removed vllm:gpu_cache_usage_perc.
    assert any("vllm:kv_cache_usage_perc" in q for q in every)
    assert not any("gpu_cache_usage_perc" in q or "gpu_prefix_cache" in q for q in every)


def test_gateway_latencies_read_the_inference_routes_only() -> None:
    """The gateway's histograms carry a `route` label: its TTFT and E2E panels read the
    generation routes', never a tokenizer call's milliseconds."""
    every = queries(Features(gpu=False, autoscale=False))
    gateway = [q for q in every if re.search(r"servepilot_(ttft|e2e)_seconds", q)]
    assert any("servepilot_e2e_seconds" in q for q in gateway)
    assert gateway and all(INFERENCE_ROUTES in q for q in gateway), gateway
    assert INFERENCE_ROUTES == 'route=~"/v1/chat/completions|/v1/completions|/v1/responses"'


def test_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = dashboard(GPU)["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, p["title"]
        cells |= mine
    refs = [[t["refId"] for t in p.get("targets", [])] for p in panels]
    assert all(len(r) == len(set(r)) for r in refs)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing: `make prometheus` installs it")
def test_every_query_parses(tmp_path: Path) -> None:
    """Prometheus's parser, through promtool: each query as a recording rule."""
    every = queries(Features(gpu=True, autoscale=True))
    records = [{"record": f"servepilot:panel_{i}", "expr": q} for i, q in enumerate(every)]
    rule_file = tmp_path / "panels.yaml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": records}]}))
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(rule_file)],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_observe_render_writes_the_dashboard_and_the_rules(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("slo: {ttft_p99_ms: 800}\n")
    assert main(["observe", "render", "-c", str(fleet), "--out", str(tmp_path / "out")]) == 0
    board = json.loads((tmp_path / "out" / "servepilot-dashboard.json").read_text())
    assert board == json.loads(json.dumps(dashboard(FleetConfig(slo={"ttft_p99_ms": 800}))))
    alerts = yaml.safe_load((tmp_path / "out" / "servepilot-alerts.yaml").read_text())
    sla = [r for r in alerts["groups"][0]["rules"] if r["alert"] == "ServepilotTtftP99OverSla"]
    assert sla[0]["expr"].endswith("> 0.8")
    assert "servepilot-alerts.yaml" in capsys.readouterr().out


def test_observe_render_into_a_file_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("")
    assert main(["observe", "render", "--out", str(blocker)]) == 2
