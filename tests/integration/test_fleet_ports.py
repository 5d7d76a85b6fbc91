"""Two fleets of one simulated replica each, on ports other than the default: what `up` prints
names its port, and `top`, `doctor`, `accept`, `status`, `down` and `logs` each pick a fleet
by --port (`logs` also once that fleet is gone and a newer one ran); a port with no fleet is
an error, a bare `down` with nothing to stop is not."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.fleetproc import cli, down, free_port, running_fleet, wait_until

# Long on the clock, light on the cores: handed out first (tests/integration/conftest.py).
pytestmark = pytest.mark.starts_first


def test_each_command_picks_a_fleet_by_its_port(tmp_path: Path) -> None:
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(yaml.safe_dump({"engine": {"kind": "sim", "sim_step_ms": 10}}))
    state, extra = tmp_path / "state", ["-c", str(fleet_yaml)]
    with running_fleet(state, 1, extra) as first, running_fleet(state, 1, extra) as second:
        env = first.env
        # What `up` prints to stop or read this fleet does not reach the other one.
        assert wait_until(lambda: "logs:" in first.log(), 30), first.log()
        assert (
            f"stop:     Ctrl-C here, or `servepilot down --port {first.port}` from another shell"
            in first.log()
        )
        assert f"logs:     `servepilot logs [r0|gateway|access] [-f] --port {first.port}`" in (
            first.log()
        )

        top = cli(["top", "--port", str(first.port)], env)
        assert top.returncode == 0, top.stderr
        assert f"{first.url}: 1 of 1 replicas healthy" in top.stdout
        assert second.url not in top.stdout

        # Without --port, doctor cannot tell the two apart; with it, it reads the first one.
        both = cli(["doctor", "--json"], env)
        assert "checking this machine only" in both.stderr, both.stderr
        doctor = cli(["doctor", "--json", "--port", str(first.port)], env)
        assert doctor.returncode in (0, 1), doctor.stderr
        assert "checking this machine only" not in doctor.stderr, doctor.stderr

        nobody = free_port()
        ports = ", ".join(str(p) for p in sorted((first.port, second.port)))
        for command in ("status", "down", "top", "doctor", "accept"):
            extra_args = ["--out", str(tmp_path / "accept")] if command == "accept" else []
            missing = cli([command, "--port", str(nobody), *extra_args], env)
            assert missing.returncode == 1, (command, missing.stdout, missing.stderr)
            assert f"error: no fleet on port {nobody}; fleets run on ports {ports}" in (
                " ".join(missing.stderr.split())
            ), (command, missing.stderr)

        down(first, timeout_s=60)
        assert second.proc.poll() is None
        down(second, timeout_s=60)

    # The first fleet is gone and a newer run exists: --port still finds the first one's run.
    gateway = cli(["logs", "gateway", "--port", str(first.port)], env)
    assert gateway.returncode == 0, gateway.stderr
    assert f"gateway listening on 127.0.0.1:{first.port}" in gateway.stdout
    never = cli(["logs", "--port", str(nobody)], env)
    assert never.returncode == 1 and f"no fleet has run on port {nobody}" in never.stderr

    # Nothing left to stop is what a bare `down` wants: said, and not an error.
    bare = cli(["down"], env)
    assert (bare.returncode, bare.stdout.strip()) == (0, "no fleet is running; nothing to stop")
