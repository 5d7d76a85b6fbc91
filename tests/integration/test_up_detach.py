"""`servepilot up --detach` with simulated replicas: it returns once the fleet serves, the fleet
outlives it in a session of its own, `status` and `down` work on it; a start that fails exits
non-zero with the reason and leaves nothing running."""

from __future__ import annotations

import json
import os
import re
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.integration.fleetproc import alive, cli, free_port, vllm_processes_in_group, wait_until

TIMEOUT_S = 120


@pytest.fixture
def env(tmp_path: Path) -> Iterator[dict[str, str]]:
    state = tmp_path / "state"
    env = {**os.environ, "SERVEPILOT_STATE": str(state)}
    yield env
    for pid in _processes_of(state):  # a failed test must not leave a fleet behind
        os.kill(pid, 9)


def _processes_of(state: Path) -> list[int]:
    """Live processes started with this test's state folder (the `up`s and their replicas)."""
    marker = f"SERVEPILOT_STATE={state}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return [pid for pid in found if pid != os.getpid() and alive(pid)]


def test_detached_fleet_serves_until_down_and_leaves_nothing(env: dict[str, str]) -> None:
    port = free_port()
    done = cli(["up", "--detach", "--engine", "sim", "--replicas", "2", "--port", str(port)],
               env, timeout_s=TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # What `up` prints, with the way to stop it that works without its terminal.
    assert f"endpoint: http://127.0.0.1:{port}/v1  (model: smollm2)" in done.stdout
    assert f"stop:     `servepilot down --port {port}`\n" in done.stdout
    assert f"logs:     `servepilot logs [r0|gateway|access] [-f] --port {port}`" in done.stdout
    state = Path(env["SERVEPILOT_STATE"])
    record = json.loads((state / "fleets" / f"{port}.json").read_text())
    assert record["state"] == "serving"
    pid, run_dir = record["pid"], Path(record["run_dir"])
    assert re.search(rf"serving in the background \(pid {pid}\); logs in {run_dir} \(its "
                     r"output: up\.log\)", " ".join(done.stderr.split()))  # fmt: skip
    # It outlives the terminal: a session of its own (no SIGHUP when the terminal closes),
    # stdin from /dev/null, its output in the run folder.
    assert os.getsid(pid) == pid != os.getsid(0)
    assert os.readlink(f"/proc/{pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{pid}/fd/1") == str(run_dir / "up.log")

    status = cli(["status"], env)
    assert f"fleet on port {port}: serving" in status.stdout, status.stdout + status.stderr
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
        {"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        assert json.loads(resp.read())["usage"]["completion_tokens"] == 4

    groups = [r["pid"] for r in record["replicas"]]
    down = cli(["down", "--port", str(port)], env, timeout_s=TIMEOUT_S)
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"fleet on port {port} stopped" in down.stderr
    assert wait_until(lambda: not alive(pid), 30)
    assert all(vllm_processes_in_group(g) == [] for g in groups)
    assert _processes_of(state) == []
    assert "stopped" in (run_dir / "up.log").read_text()


def test_a_taken_port_fails_with_the_reason_and_nothing_running(env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(["up", "--detach", "--engine", "sim", "--port", str(port)], env, TIMEOUT_S)
    assert done.returncode == 1, done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert (
        "error: the fleet did not start; its `up` exited with code 1: "
        f"port {port} on 127.0.0.1 is already in use hint: "
    ) in said
    # Once: the detached `up`'s own error is not echoed on top of this one.
    everything = " ".join((done.stdout + done.stderr).split())
    assert everything.count("is already in use") == 1, done.stdout + done.stderr
    assert "pass --port with another port" in said  # its hint still comes through
    state = Path(env["SERVEPILOT_STATE"])
    assert _processes_of(state) == []
    assert list((state / "fleets").glob("*.json")) == [] if (state / "fleets").exists() else True


def test_replicas_that_fail_to_start_fail_the_detached_up(
    env: dict[str, str], tmp_path: Path
) -> None:
    crash = tmp_path / "crash"
    crash.mkdir()
    (crash / "sitecustomize.py").write_text("raise SystemExit(3)\n")
    fleet_yaml = tmp_path / "fleet.yaml"
    fleet_yaml.write_text(
        yaml.safe_dump({"engine": {"kind": "sim", "env": {"PYTHONPATH": str(crash)}}})
    )
    port = free_port()
    done = cli(["up", "--detach", "-c", str(fleet_yaml), "--replicas", "2", "--port", str(port)],
               env, TIMEOUT_S)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    err = " ".join(done.stderr.split())
    assert re.search(
        r"error: the fleet did not start; its `up` exited with code 1: replica r[01] "
        r"\(http://127\.0\.0\.1:\d+\) exited with code 1 before it was ready; full log: \S+"
        r"/replica-r[01]\.log probable cause: .* hint: (.*; )?nothing is left running; log: "
        r"\S+/up\.log$",
        err,
    ), err
    # Said once, on stderr: the detached `up`'s own error is not echoed as well.
    assert "error:" not in done.stdout and err.count("before it was ready") == 1
    state = Path(env["SERVEPILOT_STATE"])
    assert _processes_of(state) == []
    assert not (state / "fleets" / f"{port}.json").exists()
