"""What a running `servepilot up` leaves so `status` and `down` find it from another shell.

One JSON file per gateway port under `state_dir()/fleets/`. It is written as soon as the
replicas are launched (state `starting`, so a fleet that is still loading can be seen and
stopped), rewritten as each replica becomes ready and once the gateway serves, and removed when
`up` stops; every write is atomic. A record whose `up` process is gone is stale and is cleaned
away by whoever finds it. A copy stays in the run's folder (`fleet.json`), so a run is found
by its port once its fleet is gone (`servepilot logs --port P`).
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from servepilot.core.errors import FleetError
from servepilot.core.paths import state_dir


class FleetState(StrEnum):
    STARTING = "starting"
    """The replicas are loading; the gateway does not listen yet."""
    SERVING = "serving"


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    replica_id: str
    url: str
    pid: int
    log_path: str
    ready: bool = True
    asleep: bool = False
    """Held in the warm pool by the gateway, asleep or parked (replicas.asleep, `servepilot
    sleep`): not routed to."""


@dataclass(frozen=True, slots=True)
class AutoscaleRecord:
    """What `status` shows of a fleet's autoscaler."""

    policy: str
    min_replicas: int
    max_replicas: int
    last_decision: str | None = None
    """Its last decision's log line."""
    last_decision_at_s: float | None = None
    """Unix time."""


@dataclass(frozen=True, slots=True)
class FleetRecord:
    pid: int
    """The `servepilot up` process."""
    gateway_url: str
    port: int
    started_at_s: float
    """Unix time `up` launched the replicas."""
    run_dir: str
    replicas: tuple[ReplicaRecord, ...]
    state: FleetState = FleetState.SERVING
    autoscale: AutoscaleRecord | None = None
    """None: a fixed number of replicas."""

    def is_alive(self) -> bool:
        return pid_alive(self.pid)


def fleets_dir() -> Path:
    return state_dir() / "fleets"


def record_path(port: int) -> Path:
    return fleets_dir() / f"{port}.json"


RUN_RECORD = "fleet.json"
"""The run folder's copy of its fleet's last record."""


def write_record(record: FleetRecord) -> Path:
    path = record_path(record.port)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(asdict(record), indent=2)
    _write_atomically(path, text)
    if (run_dir := Path(record.run_dir)).is_dir():
        _write_atomically(run_dir / RUN_RECORD, text)
    return path


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def run_port(run_dir: Path) -> int | None:
    """The gateway port of the fleet that ran in `run_dir`; None if it left no record (it
    stopped before launching its replicas, or it ran before runs kept one)."""
    try:
        port = json.loads((run_dir / RUN_RECORD).read_text(encoding="utf-8"))["port"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return port if isinstance(port, int) else None


def remove_record(port: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        record_path(port).unlink()


def read_records() -> list[FleetRecord]:
    """Every fleet record, stale ones included (check `is_alive()`)."""
    records = []
    for path in sorted(fleets_dir().glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            replicas = tuple(ReplicaRecord(**r) for r in data.pop("replicas"))
            state = FleetState(data.pop("state", FleetState.SERVING))
            scaling = data.pop("autoscale", None)
            autoscale = AutoscaleRecord(**scaling) if scaling is not None else None
            records.append(FleetRecord(**data, replicas=replicas, state=state,
                                       autoscale=autoscale))  # fmt: skip
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise FleetError(
                f"{path}: unreadable fleet record ({exc})",
                hint="delete the file if no `servepilot up` is running",
            ) from None
    return records


def check_no_fleet(port: int) -> None:
    """Fail if a live `up` already holds `port`: while its replicas load its gateway does not
    listen yet, so the port looks free, but two records cannot share the port."""
    for record in read_records():
        if record.port == port and record.is_alive():
            raise FleetError(
                f"a fleet is already {record.state} on port {port} (pid {record.pid})",
                hint="pass --port with another port, or stop it with `servepilot down`",
            )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True
