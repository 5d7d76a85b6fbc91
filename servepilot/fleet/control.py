"""`status` and `down` from another shell: find fleets by their records, ask or stop them."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

from servepilot.core.errors import FleetError
from servepilot.fleet.state import (
    FleetRecord,
    FleetState,
    pid_alive,
    read_records,
    remove_record,
)


@dataclass(frozen=True, slots=True)
class FleetStatus:
    record: FleetRecord
    alive: bool
    replicas: tuple[dict[str, Any], ...]
    """The gateway's /admin/replicas answer; empty if it could not be asked."""
    problem: str | None


def fleet_statuses(port: int | None = None) -> list[FleetStatus]:
    statuses = []
    for record in _select(port):
        if not record.is_alive():
            statuses.append(FleetStatus(record, False, (), "its `servepilot up` is gone"))
            continue
        if record.state is FleetState.STARTING:  # no gateway to ask yet
            statuses.append(FleetStatus(record, True, (), None))
            continue
        try:
            replicas = _get_json(f"{record.gateway_url}/admin/replicas")
            statuses.append(FleetStatus(record, True, tuple(replicas), None))
        except (OSError, ValueError) as exc:
            statuses.append(FleetStatus(record, True, (), f"the gateway did not answer: {exc}"))
    return statuses


# The gateway's sleep call waits for the replica (a first sleep takes seconds on a GPU).
_SLEEP_CALL_TIMEOUT_S = 330.0

# What `status` shows of a fleet (the CLI draws it): a line, then a row a replica.
REPLICA_COLUMNS = (
    "id", "url", "healthy", "in flight", "running", "waiting", "KV usage", "prefix cache",
)  # fmt: skip


def status_line(status: FleetStatus) -> str:
    rec = status.record
    if not status.alive:
        state = "stale"
    elif rec.state is FleetState.STARTING:
        state = _starting_state(rec)
    else:
        state = "serving"
    return (
        f"fleet on port {rec.port}: {state}, endpoint {rec.gateway_url}/v1, pid {rec.pid}\n"
        f"logs: {rec.run_dir}" + _autoscale_line(rec) + pool_line(status.replicas)
    )


_HOLDS = {
    "asleep": "weights in host memory, GPU memory freed; wakes in about a second",
    "parked": "loaded and running, all its memory held; back in rotation at once",
}


def pool_line(replicas: tuple[dict[str, Any], ...]) -> str:
    """The warm pool counted apart from the replicas serving ('' without one)."""
    states = [str(r.get("sleep", "awake")) for r in replicas]
    held = {state: states.count(state) for state in _HOLDS if state in states}
    if not held:
        return ""
    serving = sum(1 for r in replicas if r.get("sleep", "awake") == "awake" and r.get("healthy"))
    pool = "; ".join(f"{n} {state} ({_HOLDS[state]})" for state, n in held.items())
    return f"\nreplicas: {serving} serving; warm pool: {pool}"


def _autoscale_line(rec: FleetRecord) -> str:
    scaling = rec.autoscale
    if scaling is None:
        return ""
    line = f"\nautoscale: {scaling.policy} between {scaling.min_replicas} and " \
           f"{scaling.max_replicas} replicas"  # fmt: skip
    if scaling.last_decision is not None and scaling.last_decision_at_s is not None:
        at = time.strftime("%H:%M:%S", time.localtime(scaling.last_decision_at_s))
        line += f"; last decision at {at}: {scaling.last_decision.removeprefix('autoscale: ')}"
    return line


def _starting_state(rec: FleetRecord) -> str:
    waiting = [r.replica_id for r in rec.replicas if not r.ready]
    ready = len(rec.replicas) - len(waiting)
    awaited = f"waiting for {', '.join(waiting)}" if waiting else "starting the gateway"
    return f"starting ({ready} of {len(rec.replicas)} replicas ready; {awaited})"


def no_fleet_on(port: int) -> FleetError:
    """The error of a command given --port P where no fleet runs on P: which ports do. A script
    that names a port means that fleet, so it is an error, not an empty answer."""
    others = sorted(r.port for r in read_records() if r.is_alive())
    if port in others:  # its record says starting: not serving yet
        return FleetError(f"the fleet on port {port} is still starting",
                          hint="`servepilot status` says what it waits for")  # fmt: skip
    if not others:
        return FleetError(f"no fleet on port {port}; no fleet is running",
                          hint="start one with `servepilot up`")  # fmt: skip
    listed = ", ".join(str(p) for p in others)
    where = f"fleets run on ports {listed}" if len(others) > 1 else f"a fleet runs on port {listed}"
    return FleetError(f"no fleet on port {port}; {where}", hint="see `servepilot status`")


def replica_cells(replica: dict[str, Any]) -> tuple[str, ...]:
    """A row of REPLICA_COLUMNS from one entry of the gateway's /admin/replicas answer."""
    return (
        str(replica.get("id")),
        str(replica.get("url")),
        health_cell(replica),
        str(replica.get("in_flight")),
        str(replica.get("running")),
        str(replica.get("waiting")),
        f"{100 * float(replica.get('kv_cache_usage') or 0):.0f}%",
        str(replica.get("prefix_index", "-")),
    )


def guessed_lines(replicas: tuple[dict[str, Any], ...]) -> list[str]:
    """Why each replica's prefix cache is guessed rather than known from its KV events."""
    return [
        f"{r.get('id')}: prefix cache guessed: {r['prefix_index_why']}"
        for r in replicas
        if r.get("prefix_index") == "guessed" and r.get("prefix_index_why")
    ]


def health_cell(replica: dict[str, Any]) -> str:
    """yes / NO, or the warm pool's state of a replica that is not awake (asleep, waking,
    falling asleep): healthy, but not serving."""
    sleep = replica.get("sleep", "awake")
    if sleep != "awake":
        return str(sleep)
    return "yes" if replica.get("healthy") else "NO"


@dataclass(frozen=True, slots=True)
class SleepAnswer:
    """The gateway's answer to `servepilot sleep` / `wake`."""

    replica_id: str
    sleep: str
    """Its state now: asleep or awake."""
    took_s: float
    """How long the replica took to sleep or wake, measured by the gateway."""
    drained: bool


def sleep_or_wake(
    gateway_url: str, replica_id: str, action: str, query: str = "", admin_key: str | None = None
) -> SleepAnswer:
    """POST /admin/replicas/{id}/{action} (sleep or wake); FleetError with the gateway's
    message when it refuses."""
    url = f"{gateway_url}/admin/replicas/{urllib.parse.quote(replica_id, safe='')}/{action}"
    request = urllib.request.Request(url + (f"?{query}" if query else ""), method="POST")
    if admin_key is not None:
        request.add_header("Authorization", f"Bearer {admin_key}")
    try:
        with urllib.request.urlopen(request, timeout=_SLEEP_CALL_TIMEOUT_S) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raise FleetError(f"the gateway refused: {_error_message(exc)}") from None
    except (OSError, ValueError) as exc:
        raise FleetError(f"the gateway at {gateway_url} did not answer: {exc}") from None
    return SleepAnswer(str(doc["id"]), str(doc["sleep"]), float(doc["took_s"]),
                       bool(doc["drained"]))  # fmt: skip


def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        return str(json.loads(exc.read())["error"]["message"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"HTTP {exc.code}"


@dataclass(frozen=True, slots=True)
class StopOutcome:
    record: FleetRecord
    how: str
    """`drained` (up stopped itself), `killed` (had to be forced) or `stale` (already gone)."""
    leftover_pids: tuple[int, ...]


def stop_fleets(port: int | None, timeout_s: float) -> list[StopOutcome]:
    """Ask each `up` to drain and stop (SIGTERM); force it after `timeout_s`."""
    return [stop_fleet(record, timeout_s) for record in _select(port)]


def stop_fleet(record: FleetRecord, timeout_s: float) -> StopOutcome:
    """Ask the `up` of `record` to drain and stop (SIGTERM); force it after `timeout_s`."""
    how = "stale"
    if record.is_alive():
        os.kill(record.pid, signal.SIGTERM)
        how = "drained" if _wait_gone(record.pid, timeout_s) else "killed"
        if how == "killed":
            _kill(record.pid)
    # Replicas die with their parent (PDEATHSIG); this sweep is for the case where that
    # could not happen, e.g. a record left by a crashed machine.
    for replica in record.replicas:
        if _is_replica(replica.pid):
            _kill_group(replica.pid)
    leftover = tuple(r.pid for r in record.replicas if _is_replica(r.pid))
    remove_record(record.port)
    return StopOutcome(record, how, leftover)


def outcome_line(outcome: StopOutcome, timeout_s: float) -> tuple[bool, str]:
    """What `down` says of a fleet it stopped: (is it a warning, the line)."""
    port = outcome.record.port
    if outcome.how == "drained":
        return False, f"fleet on port {port} stopped"
    if outcome.how == "killed":
        return True, f"fleet on port {port} did not stop in {timeout_s:.0f} s; killed"
    return False, f"fleet on port {port} was already gone; cleaned up its record"


def _select(port: int | None) -> list[FleetRecord]:
    return [r for r in read_records() if port is None or r.port == port]


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.2)
    return not pid_alive(pid)


def _is_replica(pid: int) -> bool:
    """True if `pid` is alive and still a vLLM server or a simulated replica (pids are
    reused after a process dies)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return pid_alive(pid) and (
        b"vllm" in cmdline or b"servepilot.engine.simserver.server" in cmdline
    )


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _wait_gone(pid, 5)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    _wait_gone(pgid, 5)
