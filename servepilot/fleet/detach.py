"""`up --detach`: the fleet's `up` in a process of its own that outlives the terminal; this
one returns once the fleet serves, or says that it could not start and leaves nothing running.

This process makes the run folder first and writes there the fleet.yaml to run (flags already
applied, so the detached `up` takes no flags but `-c`). The detached `up` starts in a new
session (no controlling terminal, so closing the terminal sends it no SIGHUP) with stdin from
/dev/null and its output in the run folder's `up.log`, which this process echoes while it
waits. Its fleet record (state.py) turning `serving` means it serves; its exit before that is a
failed start, whose reason is the last error it printed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from servepilot.core.config import FleetConfig
from servepilot.core.errors import FleetError
from servepilot.fleet.control import stop_fleet
from servepilot.fleet.logs import new_run_dir, tail
from servepilot.fleet.state import FleetRecord, FleetState, read_records

UP_LOG = "up.log"
FLEET_YAML = "fleet.yaml"
STOP_TIMEOUT_S = 60.0
"""How long a failed start's `up` gets to stop its replicas before it is killed."""
_STARTUP_MARGIN_S = 60.0
"""Beyond engine.startup_timeout_s: preparing the model, then starting the gateway."""


@dataclass(frozen=True, slots=True)
class Detached:
    record: FleetRecord
    """The serving fleet's record (its `pid` is the detached `up`)."""
    log_path: Path


def start_detached(config: FleetConfig, echo: Callable[[str], None]) -> Detached:
    """Start `up` for `config` in the background; return once its fleet serves.

    `echo` gets the detached `up`'s output as it comes (what `up` prints). Raises FleetError
    when the fleet stops before serving or does not serve within the startup timeout; then
    nothing it started is left running. Ctrl-C while waiting stops it too."""
    run_dir = new_run_dir()
    run_dir.mkdir(parents=True)
    config_path = run_dir / FLEET_YAML
    write_fleet_yaml(config, config_path)
    log_path = run_dir / UP_LOG
    command = [sys.executable, "-m", "servepilot", "up", "-c", str(config_path),
               "--detached-run-dir", str(run_dir)]  # fmt: skip
    with open(os.devnull, "rb") as devnull, open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command, stdin=devnull, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + config.engine.startup_timeout_s + _STARTUP_MARGIN_S
    serving: list[FleetRecord] = []

    def waiting() -> bool:
        serving.extend(_serving_record(proc.pid))
        return not serving and proc.poll() is None and time.monotonic() < deadline

    output = HeldError(echo)
    try:
        for chunk in tail(log_path, waiting):
            output.feed(chunk)
    except BaseException:  # Ctrl-C: the user gave up waiting
        output.release()
        _stop(proc)
        raise
    if serving:
        output.release()
        return Detached(serving[0], log_path)
    code = proc.poll()
    _stop(proc)
    if code is None:
        output.release()
        why = f"it did not serve within {config.engine.startup_timeout_s:.0f} s and was stopped"
        raise FleetError(f"the fleet did not start; {why}",
                         hint=f"nothing is left running; log: {log_path}")  # fmt: skip
    if not output.held:  # killed, say: no error of its own to quote
        output.release()
    raise failed_start(code, output.held or log_path.read_text("utf-8"), log_path)


class HeldError:
    """Echoes the detached `up`'s output a line at a time, except from its first `error: `
    line on: `up` exits after printing an error, and the error this process then raises
    quotes it (echoed too, it would show twice)."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._echo = echo
        self._partial = ""
        self.held = ""

    def feed(self, chunk: str) -> None:
        if self.held:
            self.held += chunk
            return
        lines = (self._partial + chunk).split("\n")
        self._partial = lines.pop()  # a line still being written
        for i, line in enumerate(lines):
            if line.startswith("error: "):
                self.held = "\n".join(lines[i:]) + "\n" + self._partial
                self._partial = ""
                return
            self._echo(line + "\n")

    def release(self) -> None:
        """Echo whatever is held back: no error of ours will quote it."""
        if rest := self.held + self._partial:
            self._echo(rest)
        self.held = self._partial = ""


def write_fleet_yaml(config: FleetConfig, path: Path) -> None:
    """The fleet the detached `up` runs, as this one would: only the fields that were set
    (flags included), so it plans what the file leaves out as `up` and `plan` do here; every
    field written would read as given, and the engine would not be plan's. Readable by its
    owner only: it may hold API keys."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True), out, sort_keys=False)


def failed_start(code: int, output: str, log_path: Path) -> FleetError:
    """The error of a detached `up` that exited with `code` before serving, from its output:
    its last error's message, the details under it, and its hint beside ours."""
    details, hint = error_details(output)
    message = f"the fleet did not start; its `up` exited with code {code}: "
    message += failure_reason(output) + "".join("\n" + line for line in details)
    ours = f"nothing is left running; log: {log_path}"
    return FleetError(message, hint=f"{hint}; {ours}" if hint else ours)


def failure_reason(log_text: str) -> str:
    """The last error `up` printed: its `error: ` line and the lines it wrapped onto, without
    the indented details and hint under it; else `up`'s last line."""
    lines = log_text.rstrip().splitlines()
    start, end = _last_error(lines)
    if start is None:
        return lines[-1].strip() if lines else "it printed nothing"
    return " ".join([lines[start].removeprefix("error: ").strip()] +
                    [line.strip() for line in lines[start + 1 : end]])  # fmt: skip


def error_details(log_text: str) -> tuple[list[str], str | None]:
    """The indented lines under the last error `up` printed (each with the lines it wrapped
    onto), and its hint, apart."""
    lines = log_text.rstrip().splitlines()
    start, end = _last_error(lines)
    if start is None:
        return [], None
    details: list[str] = []
    hint: list[str] = []
    in_hint = False
    for line in lines[end:]:
        if line.startswith("  hint: "):
            in_hint = True
            hint.append(line.removeprefix("  hint: ").strip())
        elif line[:1].isspace() or not line:
            in_hint = False
            details.append(line)
        elif in_hint:  # the hint wrapped onto this line
            hint.append(line.strip())
        else:
            details.append(line)
    return details, " ".join(hint) or None


def _last_error(lines: list[str]) -> tuple[int | None, int]:
    """Where the last `error: ` line is, and the end of the lines it wrapped onto."""
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    if not starts:
        return None, len(lines)
    end = starts[-1] + 1
    while end < len(lines) and lines[end] and not lines[end][0].isspace():
        end += 1
    return starts[-1], end


def _serving_record(pid: int) -> list[FleetRecord]:
    # By pid, not port: with --port 0 only the detached `up` knows the port it got.
    return [r for r in read_records() if r.pid == pid and r.state is FleetState.SERVING]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the detached `up` and whatever it started; reap it."""
    for record in read_records():
        if record.pid == proc.pid:
            stop_fleet(record, STOP_TIMEOUT_S)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # `up` stops its replicas on SIGTERM
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
