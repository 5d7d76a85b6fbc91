"""`accept`, `doctor` and `top` as a user runs them, against a fleet of two simulated replicas
that `servepilot up` started: found by its record, read over HTTP, its logs from the run folder."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.fleetproc import (
    RunningFleet,
    cli,
    embedded_kv_tokens,
    running_fleet,
    wait_until,
)


@pytest.fixture(scope="module")
def sim_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningFleet]:
    root = tmp_path_factory.mktemp("ops")
    fleet_yaml = root / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({
        "engine": {"kind": "sim", "sim_step_ms": 2},
        "slo": {"ttft_p99_ms": 2000},
    }))  # fmt: skip
    with running_fleet(root / "state", 2, ["-c", str(fleet_yaml)]) as fleet:
        fleet.env["FLEET_YAML"] = str(fleet_yaml)
        yield fleet


def test_accept_end_to_end_with_a_short_soak(sim_fleet: RunningFleet, tmp_path: Path) -> None:
    out = tmp_path / "acc"
    args = ["accept", "-c", sim_fleet.env["FLEET_YAML"], "--out", str(out), "--soak", "5s",
            "--requests", "4", "--max-concurrency", "2"]  # fmt: skip
    done = cli(args, sim_fleet.env, timeout_s=180)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["schema"] == "servepilot.accept/v1" and report["verdict"] == "pass"
    verdicts = [(i["number"], i["verdict"]) for i in report["items"]]
    assert verdicts == [(1, "n/a"), *((n, "pass") for n in range(2, 9))]
    items = {i["number"]: i["evidence"] for i in report["items"]}
    assert items[1] == "CPU replicas: no tensor parallelism (2 replicas)"
    # The simulated replicas print vLLM's KV line for the embedded model at 2 GiB, in the
    # dtype `auto` picks on this CPU (float32 without native bfloat16: half the tokens).
    kv = embedded_kv_tokens()
    assert f"r0: {kv} KV tokens" in items[3] and f"r1: {kv} KV tokens" in items[3]
    assert items[4].startswith("2 levels: c=1 ")
    assert "ttft_p99_ms 2000) met" in items[5]
    sweep = json.loads((out / "sweep" / "results.json").read_text())
    assert [r["load"]["value"] for r in sweep["runs"]] == [1, 2]
    soak = json.loads((out / "soak" / "results.json").read_text())
    assert soak["runs"][0]["windows"]  # the soak is reported in windows
    # The soak samples every replica's processes, as bench --soak does on this fleet.
    for w in soak["runs"][0]["windows"]:
        assert {key.split()[0] for key in w["memory_by_source_bytes"]} == {"r0", "r1"}
    assert "the replicas' at most" in items[7]
    assert "soak memory: the target's /metrics and each process of its 2 replicas" in done.stderr
    assert report["fleet_yaml"]["engine"]["kind"] == "sim"
    assert report["commands"][1].startswith("servepilot accept -c ")
    page = (out / "report.html").read_text()
    assert "Acceptance: <span" in page and page.count(">PASS<") == 1 + 7  # the headline, items
    assert "sweep/report.html" in page
    # Progress: bench's plain lines (stderr is not a terminal here).
    assert "• sweep: concurrency 1 to at most 2, 4 requests a level" in done.stderr
    assert "level 1 · concurrency 1: done in" in done.stderr


def test_doctor_on_a_running_fleet(sim_fleet: RunningFleet, tmp_path: Path) -> None:
    case = tmp_path / "case"
    done = cli(["doctor", "--json", "--save", str(case)], sim_fleet.env)
    assert done.returncode == 0, done.stdout + done.stderr
    findings = json.loads(done.stdout)
    assert [f["severity"] for f in findings if f["severity"] == "problem"] == []
    # Replicas by id, whichever joined first: a replay of the saved case says the same.
    assert any(f["rule"] == "metric_names" and f["evidence"].startswith("r0: vllm:kv_cache")
               for f in findings)  # fmt: skip
    # The evidence was read live: both replicas' pages and logs, the gateway's page.
    assert {p.name for p in case.iterdir()} >= {
        "gateway.metrics", "r0.metrics", "r1.metrics", "r0.log", "r1.log", "env.json", "fleet.yaml"
    }  # fmt: skip
    assert f"KV cache size: {embedded_kv_tokens()} tokens" in (case / "r0.log").read_text()
    replay = cli(["doctor", "--from", str(case), "--json"], sim_fleet.env)
    assert json.loads(replay.stdout) == findings


def test_top_prints_one_snapshot_when_piped(sim_fleet: RunningFleet) -> None:
    done = cli(["top"], sim_fleet.env)
    assert done.returncode == 0, done.stderr
    assert f"{sim_fleet.url}: 2 of 2 replicas healthy" in done.stdout
    assert "since the gateway started" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines()]
    assert next(r for r in rows if r[:1] == ["r0"])[:2] == ["r0", "yes"]


def test_no_fleet_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    env = {**os.environ, "SERVEPILOT_STATE": str(tmp_path / "state")}
    top = cli(["top"], env)
    assert top.returncode == 1 and "no fleet is serving here" in top.stderr
    dead = cli(["top", "--url", "http://127.0.0.1:9"], env)
    assert (
        dead.returncode == 1 and "the gateway at http://127.0.0.1:9 did not answer" in dead.stderr
    )
    accept = cli(["accept", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "a")], env)
    assert accept.returncode == 2 and "cannot connect" in accept.stderr
    # doctor still looks at this machine.
    doctor = cli(["doctor", "--json"], env)
    assert "no fleet is serving here: checking this machine only" in doctor.stderr
    assert isinstance(json.loads(doctor.stdout), list)
    for done in (top, dead, accept, doctor):
        assert "Traceback" not in done.stderr


def test_top_shows_the_autoscalers_decision(tmp_path: Path) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({"engine": {"kind": "sim", "sim_step_ms": 2}}))
    extra = ["-c", str(fleet_yaml), "--autoscale", "1:2"]
    with running_fleet(tmp_path / "state", 1, extra) as fleet:
        shown: list[str] = []

        def decided() -> bool:
            done = cli(["top"], fleet.env)
            assert done.returncode == 0, done.stderr
            shown.append(done.stdout)
            return "autoscaler" in done.stdout

        # The gauge appears with the controller's first decision, a tick after serving.
        assert wait_until(decided, timeout_s=60, interval_s=1), shown[-1]
        # An idle fleet at its minimum: the step policy holds one replica.
        assert "· autoscaler wants 1 replica\n" in shown[-1]
