"""`up`: the replicas and the gateway in front of them, from start to an ordered shutdown.

Order of start: model -> replicas (all ready) -> gateway -> fleet record.
Order of stop, the reverse: record -> gateway (drain in-flight work) -> replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from servepilot.core.config import EngineKind, FleetConfig
from servepilot.core.paths import state_dir
from servepilot.engine.model_source import ResolvedModel, resolve_model
from servepilot.engine.process import ReplicaInfo
from servepilot.engine.simserver.args import SimModel, sim_model
from servepilot.fleet.local import LocalReplicas
from servepilot.fleet.serve import ServedGateway, Upstream, check_port_free, start_gateway
from servepilot.fleet.state import FleetRecord, ReplicaRecord, remove_record, write_record
from servepilot.routing.admission.budget import replica_capacity

# Draining waits this long for in-flight requests when `up` is told to stop.
DRAIN_TIMEOUT_S = 30.0
_WATCH_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class UpStarted:
    """What `up` tells the user once everything serves."""

    gateway_url: str
    model_name: str
    replicas: tuple[ReplicaInfo, ...]

    @property
    def curl_example(self) -> str:
        """A request to try the endpoint with, ready to paste into a shell."""
        body = json.dumps(
            {"model": self.model_name, "messages": [{"role": "user", "content": "Hello!"}]}
        )
        return (
            f"curl {self.gateway_url}/v1/chat/completions "
            f"-H 'Content-Type: application/json' -d {shlex.quote(body)}"
        )


# What `up` shows of each replica (the CLI draws it): a line when it is ready, a row once all
# serve.
REPLICA_COLUMNS = ("id", "url", "pid", "KV tokens", "max concurrency")


def ready_line(info: ReplicaInfo) -> str:
    kv = f"{info.kv.kv_capacity_tokens:,} KV tokens" if info.kv else "KV capacity not reported"
    return f"replica {info.replica_id} ready at {info.url} in {info.startup_s:.0f} s ({kv})"


def replica_cells(info: ReplicaInfo) -> tuple[str, ...]:
    """A row of REPLICA_COLUMNS; `?` where the replica's log did not say."""
    kv = info.kv
    return (
        info.replica_id,
        info.url,
        str(info.pid),
        f"{kv.kv_capacity_tokens:,}" if kv else "?",
        f"{kv.max_concurrency:.1f} x {kv.max_model_len_tokens:,} tokens"
        if kv and kv.max_concurrency and kv.max_model_len_tokens
        else "?",
    )


class UpReporter:
    """Callbacks through which `up` reports progress; the CLI prints them."""

    def __init__(
        self,
        step: Callable[[str], None],
        replica_ready: Callable[[ReplicaInfo], None],
        serving: Callable[[UpStarted], None],
        warn: Callable[[str], None],
    ) -> None:
        self.step = step
        self.replica_ready = replica_ready
        self.serving = serving
        self.warn = warn


async def run_up(config: FleetConfig, report: UpReporter) -> None:
    """Serve until SIGINT or SIGTERM, then drain and stop everything."""
    gw = config.gateway
    check_port_free(gw.host, gw.port)
    model: ResolvedModel | SimModel
    if config.engine.kind is EngineKind.SIM:
        model = sim_model(config.model, config.engine.sim_tokenizer)
        what = "simulated"
    else:
        # Converting the embedded model takes tens of seconds the first time: off the loop.
        model = await asyncio.to_thread(resolve_model, config.model, progress=report.step)
        what = "vLLM"
    run_dir = state_dir() / "runs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    replicas = LocalReplicas(config, model, run_dir)
    stop = _stop_event()
    report.step(f"starting {config.replicas.count} {what} replica(s); logs in {run_dir}")
    start = asyncio.ensure_future(replicas.start(on_ready=report.replica_ready))
    stop_wait = asyncio.ensure_future(stop.wait())
    await asyncio.wait({start, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if not start.done():
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
        stop_wait.cancel()
        return
    stop_wait.cancel()
    infos = start.result()
    served: ServedGateway | None = None
    try:
        upstreams = [
            Upstream(
                i.replica_id,
                i.url,
                replica_capacity(config, i.kv.kv_capacity_tokens if i.kv else None),
            )
            for i in infos
        ]
        served = await start_gateway(gw, upstreams)
        write_record(_record(served, infos, run_dir))
        report.serving(UpStarted(served.url, model.served_name, tuple(infos)))
        await _watch(replicas, stop, report)
    finally:
        remove_record(served.port if served else gw.port)
        report.step("draining the gateway and stopping the replicas")
        if served is not None:
            await served.stop(DRAIN_TIMEOUT_S)
        await replicas.stop()


async def _watch(replicas: LocalReplicas, stop: asyncio.Event, report: UpReporter) -> None:
    """Wait for the stop signal; warn once for each replica that dies meanwhile."""
    reported: set[str] = set()
    while not stop.is_set():
        for proc, code in replicas.exited():
            if proc.replica_id not in reported:
                reported.add(proc.replica_id)
                report.warn(
                    f"replica {proc.replica_id} exited with code {code}; the gateway routes "
                    f"around it (log: {proc.log_path})"
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), _WATCH_INTERVAL_S)


def _stop_event() -> asyncio.Event:
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, event.set)
    return event


def _record(
    served: ServedGateway, infos: list[ReplicaInfo], run_dir: os.PathLike[str]
) -> FleetRecord:
    return FleetRecord(
        pid=os.getpid(),
        gateway_url=served.url,
        port=served.port,
        started_at_s=time.time(),
        run_dir=str(run_dir),
        replicas=tuple(ReplicaRecord(i.replica_id, i.url, i.pid, str(i.log_path)) for i in infos),
    )
