"""accept's report.json and report.html: the verdicts, the evidence (escaped), the reproduction."""

import json
from pathlib import Path

from servepilot.core.config import FleetConfig
from servepilot.engine.startup_log import KvCapacity
from servepilot.observe.accept.items import Measured, Smoke, checklist
from servepilot.observe.accept.report import SCHEMA, reproduce_commands, write_report
from servepilot.observe.accept.run import Acceptance


def test_a_failed_smoke_fails_the_report_and_its_evidence_is_escaped(tmp_path: Path) -> None:
    measured = Measured(
        config=FleetConfig(), kv={"r0": KvCapacity(93_184, 2048, 45.5)},
        smoke=Smoke(False, "HTTP 500: <script>alert(1)</script>", 0.01), sweep=None, soak=None,
        soak_s=120.0, preemptions=None, recorded=True, replicas=1,
    )  # fmt: skip
    acceptance = Acceptance(checklist(measured), measured, sweep=None, soak=None)
    commands = ["servepilot up", "servepilot accept --out x"]
    json_path, html_path = write_report(tmp_path, acceptance, "http://gw", commands)
    doc = json.loads(json_path.read_text())
    assert doc["schema"] == SCHEMA and doc["verdict"] == "fail"
    assert [i["verdict"] for i in doc["items"]] == [
        "n/a", "fail", "pass", "fail", "fail", "n/a", "fail", "pass"
    ]  # fmt: skip
    assert doc["startup_kv"] == {
        "r0": {"kv_capacity_tokens": 93_184, "max_model_len_tokens": 2048, "max_concurrency": 45.5}
    }
    assert doc["sweep"] is None and doc["commands"] == commands
    assert doc["fleet_yaml"]["engine"]["cpu_kv_cache_space_gib"] == 2.0
    page = html_path.read_text()
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "servepilot accept --out x" in page
    assert not (tmp_path / "sweep").exists()


def test_the_report_writes_down_the_up_and_accept_commands_quoted() -> None:
    here = reproduce_commands(Path("my fleet.yaml"), 8080, ["accept", "--out", "a b"])
    assert here == ["servepilot up -c 'my fleet.yaml' --port 8080", "servepilot accept --out 'a b'"]
    assert reproduce_commands(None, None, ["accept"])[0] == "servepilot up"
