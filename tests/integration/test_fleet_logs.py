"""`servepilot logs` on a fleet of one simulated replica: while it runs and once it is gone;
`up`'s steps carry the time."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tests.integration.fleetproc import cli, down, running_fleet


def test_logs_of_a_running_and_of_the_last_fleet(tmp_path: Path) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({"engine": {"kind": "sim", "sim_step_ms": 10}}))
    with running_fleet(tmp_path / "state", 1, ["-c", str(fleet_yaml)]) as fleet:
        replica = cli(["logs", "r0"], fleet.env)
        assert replica.returncode == 0, replica.stderr
        assert "KV cache" in replica.stdout  # what the replica printed at startup
        gateway = cli(["logs", "gateway", "--port", str(fleet.port)], fleet.env)
        assert re.search(
            r"INFO servepilot.gateway.pool: replica r0 added \(http://", gateway.stdout
        )
        assert re.search(r"^• \d\d:\d\d:\d\d replica r0 ready at", fleet.log(), re.MULTILINE)
        down(fleet, timeout_s=60)
        # Gone: the last run's logs are still there to read.
        after = cli(["logs"], fleet.env)
        assert after.returncode == 0 and after.stdout.startswith(gateway.stdout.splitlines()[0])
        assert "gateway listening" in gateway.stdout
    missing = cli(["logs", "r5"], fleet.env)
    assert missing.returncode == 1 and "the logs of this run: access, gateway, r0" in missing.stderr
