"""One vLLM replica as a child process: start on a free port, await readiness, stop cleanly.

Each replica runs in its own process group (vLLM forks an engine-core process), so stopping
signals the whole group. The kernel sends the replica SIGTERM if the process that started it
dies, even by SIGKILL (PR_SET_PDEATHSIG), so no replica outlives `servepilot up`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from servepilot.core.errors import EngineStartError
from servepilot.engine.args import KvEventsPorts, LaunchCommand
from servepilot.engine.smoke import SmokeFailure, smoke_generation
from servepilot.engine.startup_log import (
    GpuStartup,
    KvCapacity,
    diagnose_failure,
    parse_gpu_startup,
    parse_kv_capacity,
)

_PR_SET_PDEATHSIG = 1
_LOG_TAIL_LINES = 25


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """What is known about a replica once it is ready."""

    replica_id: str
    url: str
    pid: int
    log_path: Path
    kv: KvCapacity | None
    startup_s: float
    gpu: GpuStartup | None = None
    """What a GPU replica's log said about loading (weights, CUDA graphs, KV per GPU)."""
    kv_events: KvEventsPorts | None = None
    """Where it publishes its KV cache events; None: it publishes none."""


class ReplicaProcess:
    """Owns one replica's process from start to stop."""

    def __init__(
        self,
        replica_id: str,
        command: LaunchCommand,
        url: str,
        log_path: Path,
        kv_events: KvEventsPorts | None = None,
    ) -> None:
        self.kv_events = kv_events
        self.replica_id = replica_id
        self.command = command
        self.url = url
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.command.env}
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self.command.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self._started_at = time.monotonic()

    def exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    async def wait_ready(self, timeout_s: float) -> ReplicaInfo:
        """Poll /health until 200; raise EngineStartError with the cause if it dies or stalls."""
        assert self._proc is not None, "start() first"
        deadline = self._started_at + timeout_s
        probe_timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=probe_timeout) as session:
            while True:
                code = self._proc.poll()
                if code is not None:
                    raise self._failure(f"exited with code {code} before it was ready", code)
                if await _healthy(session, self.url):
                    break
                if time.monotonic() > deadline:
                    await asyncio.to_thread(self.stop, 5.0)
                    raise self._failure(f"was not ready after {timeout_s:.0f} s", None)
                await asyncio.sleep(0.5)
        await self._smoke()
        log = self.log_text()
        gpu = parse_gpu_startup(log)
        return ReplicaInfo(
            replica_id=self.replica_id,
            url=self.url,
            pid=self._proc.pid,
            log_path=self.log_path,
            kv=parse_kv_capacity(log),
            startup_s=time.monotonic() - self._started_at,
            gpu=gpu if gpu.found else None,
            kv_events=self.kv_events,
        )

    async def _smoke(self) -> None:
        """Readiness needs tokens, not only /health: a replica that cannot generate is
        stopped and reported before it goes into rotation."""
        try:
            await smoke_generation(self.url)
        except SmokeFailure as exc:
            await asyncio.to_thread(self.stop, 5.0)
            raise self._failure(
                f"answered /health but its smoke generation failed ({exc})",
                None,
                cause="the server runs but the model does not generate",
            ) from None

    def terminate(self) -> None:
        """SIGTERM the replica's process group without waiting (`stop` waits)."""
        if self._proc is not None and self._proc.poll() is None:
            _signal_group(self._proc.pid, signal.SIGTERM)

    def stop(self, grace_s: float) -> None:
        """SIGTERM the replica's process group, then SIGKILL what is left after `grace_s`."""
        if self._proc is None:
            return
        pgid = self._proc.pid
        _signal_group(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=grace_s)
        # The engine-core child may outlive the API server: sweep the group either way.
        _signal_group(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def _failure(
        self, what: str, exit_code: int | None, cause: str | None = None
    ) -> EngineStartError:
        log = self.log_text()
        tail = "\n".join(log.splitlines()[-_LOG_TAIL_LINES:])
        found, hint = diagnose_failure(log, exit_code)
        # `cause` stands in for the generic one only: what the log names wins.
        if cause is not None and (found, hint) == diagnose_failure("", exit_code):
            found, hint = cause, "read the replica's full log for the engine's own error"
        return EngineStartError(
            f"replica {self.replica_id} ({self.url}) {what}; full log: {self.log_path}",
            cause=found,
            log_tail=tail,
            hint=hint,
        )


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _healthy(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/health") as resp:
            return resp.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False
