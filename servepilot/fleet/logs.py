"""The logs of a fleet `up` started: one file per replica, one for the gateway and its access
log, in the run's folder (`state_dir()/runs/<time>-<pid>/`). `servepilot logs` finds them
through the fleet records, or in the newest run folder (on the port asked for) once the fleet
is gone."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from servepilot.core.errors import FleetError
from servepilot.core.paths import state_dir
from servepilot.fleet.state import FleetRecord, pid_alive, read_records, run_port

GATEWAY = "gateway"
ACCESS = "access"
GATEWAY_LOG = "gateway.log"
ACCESS_LOG = "access.log"
"""The gateway's access log (JSON lines), unless gateway.access_log.path puts it elsewhere."""
_FOLLOW_POLL_S = 0.5


def runs_dir() -> Path:
    return state_dir() / "runs"


def new_run_dir() -> Path:
    """The folder of a new run (not created): named by the time and this process's pid."""
    return runs_dir() / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def replica_log_name(replica_id: str) -> str:
    return f"replica-{replica_id}.log"


@dataclass(frozen=True, slots=True)
class LogSource:
    path: Path
    up_pid: int | None
    """The `up` process writing it (None: the run is over)."""


def find_log(name: str, port: int | None) -> LogSource:
    """The log called `name` (`gateway`, `access`, or a replica id such as `r0`) of the
    running fleet (the one on `port`), else of the newest run (on `port`)."""
    named = {GATEWAY: GATEWAY_LOG, ACCESS: ACCESS_LOG}
    filename = named.get(name) or replica_log_name(name.removeprefix("replica-"))
    running = [r for r in read_records() if r.is_alive() and port in (None, r.port)]
    if len(running) > 1:
        ports = ", ".join(str(r.port) for r in running)
        raise FleetError(f"fleets run on ports {ports}", hint="pass --port P to pick one")
    if running:
        return _in_run(Path(running[0].run_dir), filename, running[0])
    runs = sorted(p for p in runs_dir().glob("*-*") if p.is_dir()) if runs_dir().is_dir() else []
    if port is not None:
        runs = [run for run in runs if run_port(run) == port]
        if not runs:
            raise FleetError(
                f"no fleet has run on port {port}",
                hint="`servepilot status` shows the fleets running; `servepilot logs` without "
                "--port reads the newest run",
            )
    if not runs:
        raise FleetError("no fleet has run yet", hint="start one with `servepilot up`")
    return _in_run(runs[-1], filename, None)


def _in_run(run_dir: Path, filename: str, record: FleetRecord | None) -> LogSource:
    path = run_dir / filename
    if not path.is_file():
        have = sorted(
            p.name.removeprefix("replica-").removesuffix(".log") for p in run_dir.glob("*.log")
        )
        raise FleetError(
            f"{path} does not exist", hint=f"the logs of this run: {', '.join(have) or 'none'}"
        )
    return LogSource(path, record.pid if record else None)


def log_chunks(name: str, port: int | None, *, follow: bool) -> Iterator[str]:
    """The text of the log `find_log` finds; with `follow`, then what is appended to it
    until its fleet stops (a finished run's: until interrupted)."""
    source = find_log(name, port)
    pid = source.up_pid
    return tail(source.path, lambda: follow and (pid is None or pid_alive(pid)))


def tail(path: Path, keep_going: Callable[[], bool]) -> Iterator[str]:
    """The file's text, then what is appended to it, while `keep_going()` (`tail -f`)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        while True:
            if chunk := f.read():
                yield chunk
                continue
            going = keep_going()
            # What was written while the writer stopped still comes out.
            if chunk := f.read():
                yield chunk
            if not going:
                return
            time.sleep(_FOLLOW_POLL_S)


_GATEWAY_LOGGERS = ("servepilot.gateway", "servepilot.fleet.autoscale")


@contextlib.contextmanager
def gateway_log(run_dir: Path) -> Iterator[None]:
    """While inside: the gateway's (and its autoscaler's) log records go to the run's
    gateway.log (INFO and up), and warnings also to stderr, as bare messages (what they
    looked like before)."""
    loggers = [logging.getLogger(name) for name in _GATEWAY_LOGGERS]
    run_dir.mkdir(parents=True, exist_ok=True)
    to_file = logging.FileHandler(run_dir / GATEWAY_LOG, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    to_stderr = logging.StreamHandler(sys.stderr)
    to_stderr.setLevel(logging.WARNING)
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
        logger.addHandler(to_file)
        logger.addHandler(to_stderr)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.removeHandler(to_file)
            logger.removeHandler(to_stderr)
            logger.setLevel(level)
        to_file.close()
