"""`up`: the replicas and the gateway in front of them, from start to an ordered shutdown.

Order of start: model -> replicas launched -> fleet record (`starting`) -> replicas ready ->
gateway -> fleet record (`serving`).
With `autoscale.enabled`, the autoscaler starts once the gateway serves (`fleet.autoscale`).
Order of stop, the reverse: autoscaler -> record -> gateway (drain in-flight work) ->
replicas. Stopped while starting: the replicas are stopped, then the record goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from servepilot.core import accel
from servepilot.core.config import (
    ClusterBackend,
    EngineKind,
    FleetConfig,
    GatewayConfig,
    Weights,
    check_warm_pool,
)
from servepilot.core.errors import FleetError
from servepilot.core.loop import cancel_and_wait
from servepilot.engine.model_source import ResolvedModel, resolve_model
from servepilot.engine.process import ReplicaInfo
from servepilot.engine.simserver.args import SimModel, sim_model
from servepilot.fleet.autoscale.controller import AutoscaleController, Decision
from servepilot.fleet.autoscale.start import (
    check_autoscale,
    initial_replicas,
    local_backend,
    start_autoscaler,
)
from servepilot.fleet.launched import launched_fleet
from servepilot.fleet.local import LocalReplicas
from servepilot.fleet.logs import ACCESS_LOG, gateway_log, new_run_dir
from servepilot.fleet.serve import (
    ServedGateway,
    Upstream,
    check_port_free,
    fleet_facts,
    start_gateway,
)
from servepilot.fleet.state import (
    AutoscaleRecord,
    FleetRecord,
    FleetState,
    ReplicaRecord,
    check_no_fleet,
    remove_record,
    write_record,
)
from servepilot.fleet.warm_pool import put_to_sleep, record_rows, replicas_to_sleep
from servepilot.gateway import ReplicaPool
from servepilot.plan.request import fleet_vllm_defaults
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
    detached: bool = False
    """Started by `up --detach`: no terminal to press Ctrl-C in."""
    dummy_weights: bool = False
    """model.weights: dummy: the replicas serve random weights, so the output means nothing."""

    @property
    def endpoint_text(self) -> str:
        """Where to send requests, one to try, how to stop (under the replicas' table)."""
        # Off the default port the commands name it: a bare `down` stops every fleet here.
        port = urlsplit(self.gateway_url).port
        flag = "" if port == GatewayConfig.model_fields["port"].default else f" --port {port}"
        down = f"`servepilot down{flag}`"
        stop = down if self.detached else f"Ctrl-C here, or {down} from another shell"
        weights = ", DUMMY weights: random, from its config alone" if self.dummy_weights else ""
        return (
            f"\nendpoint: {self.gateway_url}/v1  (model: {self.model_name}{weights})\n"
            f"try:      {self.curl_example}\n"
            f"stop:     {stop}\n"
            f"logs:     `servepilot logs [r0|gateway|access] [-f]{flag}`\n"
            f"gateway:  data path {accel.status(accel.GATEWAY)}\n"
        )

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
    gpu = f"; {info.gpu.summary()}" if info.gpu else ""
    return f"replica {info.replica_id} ready at {info.url} in {info.startup_s:.0f} s ({kv}{gpu})"


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
    """Callbacks through which `up` reports progress; the CLI prints them. Steps and
    warnings come with the wall-clock time: startup takes minutes, and its log is read later."""

    def __init__(
        self,
        step: Callable[[str], None],
        serving: Callable[[UpStarted], None],
        warn: Callable[[str], None],
    ) -> None:
        self._step = step
        self._warn = warn
        self.serving = serving

    def step(self, message: str) -> None:
        self._step(stamped(message))

    def warn(self, message: str) -> None:
        self._warn(stamped(message))

    def replica_ready(self, info: ReplicaInfo) -> None:
        self.step(ready_line(info))


def stamped(message: str) -> str:
    return f"{time.strftime('%H:%M:%S')} {message}"


async def run_up(
    config: FleetConfig, report: UpReporter, detached_run_dir: Path | None = None
) -> None:
    """Serve until SIGINT or SIGTERM, then drain and stop everything. `detached_run_dir`:
    this is the process `up --detach` started, in the run folder it made (detach.py)."""
    check_autoscale(config)
    check_warm_pool(config)
    launched = launched_fleet(config)
    if launched.note is not None:
        report.warn(launched.note)
    config = launched.config
    if config.cluster.backend is ClusterBackend.RAY:
        await _run_on_ray(config, report, detached_run_dir)
        return
    gw = config.gateway
    check_port_free(gw.host, gw.port)
    check_no_fleet(gw.port)
    model: ResolvedModel | SimModel
    if config.engine.kind is EngineKind.SIM:
        model = sim_model(config.model, config.engine.sim_tokenizer)
        what = "simulated"
    else:
        # Converting the embedded model takes tens of seconds the first time: off the loop.
        model = await asyncio.to_thread(resolve_model, config.model, progress=report.step)
        what = "vLLM"
    run_dir = detached_run_dir or new_run_dir()
    replicas = LocalReplicas(config, model, run_dir)
    if replicas.devices is not None:
        report.step(f"GPUs per replica: {replicas.devices.describe()}")
    stop = stop_event()
    count = initial_replicas(config)
    report.step(f"starting {count} {what} replica(s); logs in {run_dir}")
    replicas.launch(count)
    for line in replicas.deferred():
        report.step(line)
    awaited = [ReplicaRecord(p.replica_id, p.url, p.pid or 0, str(p.log_path), ready=False)
               for p in replicas.processes]  # fmt: skip
    starting = StartingRecord(f"http://{gw.host}:{gw.port}", gw.port, run_dir, awaited)
    try:
        infos = await until_stopped(replicas.wait_ready(starting.ready(report)), stop)
        if infos is not None:
            with gateway_log(run_dir):
                await _serve(config, model.served_name, replicas, infos, stop, report,
                             detached=detached_run_dir is not None)  # fmt: skip
    finally:
        remove_record(gw.port)


async def until_stopped(
    ready: Coroutine[Any, Any, list[ReplicaInfo]], stop: asyncio.Event
) -> list[ReplicaInfo] | None:
    """The replicas once all are ready, or None if told to stop first (they are stopped)."""
    start = asyncio.ensure_future(ready)
    stop_wait = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({start, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_wait.cancel()
    if start.done():
        return start.result()
    await cancel_and_wait(start)
    return None


async def _serve(
    config: FleetConfig,
    model_name: str,
    replicas: LocalReplicas,
    infos: list[ReplicaInfo],
    stop: asyncio.Event,
    report: UpReporter,
    *,
    detached: bool,
) -> None:
    """Start the gateway in front of the ready replicas and serve until told to stop."""
    served: ServedGateway | None = None
    autoscaler: AutoscaleController | None = None
    try:
        defaults = fleet_vllm_defaults(config)
        upstreams = [
            Upstream(
                i.replica_id,
                i.url,
                replica_capacity(config, defaults, i.kv.kv_capacity_tokens if i.kv else None),
            )
            for i in infos
        ]
        served = await start_gateway(
            config.gateway, upstreams, replicas.run_dir / ACCESS_LOG, fleet_facts(config)
        )
        if served.port != config.gateway.port:  # port 0: the OS picked one
            remove_record(config.gateway.port)
        pool = served.gateway.pool
        sleepers = replicas_to_sleep([i.replica_id for i in infos], config.replicas.asleep)
        await put_to_sleep(served.gateway.warm, sleepers, report.step, report.warn)
        # Announced first, then recorded: a script (or test) that waits for the record's
        # `serving` finds the endpoint already printed.
        dummy = config.model.weights is Weights.DUMMY
        report.serving(UpStarted(served.url, model_name, tuple(infos), detached, dummy))
        record = ServingRecord(
            served, replicas.run_dir, lambda: record_rows(replicas.processes, pool), config
        )
        record.write()
        served.gateway.warm.on_change(lambda _: record.write())
        if config.autoscale.enabled:
            cold_start_s = max(i.startup_s for i in infos)
            backend = local_backend(config, served.gateway, replicas)
            autoscaler = start_autoscaler(config, served.gateway, backend, cold_start_s,
                                          record.on_decision(report))  # fmt: skip
        await _watch(replicas, pool, stop, report)
    finally:
        if autoscaler is not None:
            await autoscaler.stop()  # first: nothing starts, stops or rewrites the record after
        if served is not None:
            remove_record(served.port)
        report.step("draining the gateway and stopping the replicas")
        if served is not None:
            await served.stop(DRAIN_TIMEOUT_S)
        await replicas.stop()


class ServingRecord:
    """The fleet record once the gateway serves; rewritten at each autoscaling decision
    (the replicas it lists, so `down` finds every process, and the decision for `status`).
    The Ray backend's `up` keeps one too."""

    def __init__(
        self,
        served: ServedGateway,
        run_dir: Path,
        rows: Callable[[], tuple[ReplicaRecord, ...]],
        config: FleetConfig,
    ) -> None:
        """`rows`: the replicas serving at the time of writing."""
        self.served = served
        self.run_dir = run_dir
        self._rows = rows
        scaling = config.autoscale
        self.autoscale = (
            AutoscaleRecord(scaling.policy.value, scaling.min_replicas, scaling.max_replicas)
            if scaling.enabled
            else None
        )
        self.started_at_s = time.time()

    def write(self) -> None:
        served, run_dir = self.served, str(self.run_dir)
        write_record(FleetRecord(os.getpid(), served.url, served.port, self.started_at_s,
                                 run_dir, self._rows(), autoscale=self.autoscale))  # fmt: skip

    def on_decision(self, report: UpReporter) -> Callable[[Decision], None]:
        """Report a change on up's output, then record the decision."""

        def heard(decision: Decision) -> None:
            if decision.direction != "hold":
                report.step(decision.line())
            if self.autoscale is not None:
                self.autoscale = replace(self.autoscale, last_decision=decision.line(),
                                         last_decision_at_s=decision.at_s)  # fmt: skip
            self.write()

        return heard


class StartingRecord:
    """The fleet record while the replicas load: which are ready, which are awaited (the Ray
    backend's `up` keeps one too)."""

    def __init__(
        self, gateway_url: str, port: int, run_dir: Path, awaited: Sequence[ReplicaRecord]
    ) -> None:
        self.gateway_url = gateway_url
        self.port = port
        self.run_dir = run_dir
        self.rows = {row.replica_id: row for row in awaited}
        self.started_at_s = time.time()
        self.write()

    def write(self) -> None:
        write_record(
            FleetRecord(os.getpid(), self.gateway_url, self.port, self.started_at_s,
                        str(self.run_dir), tuple(self.rows.values()), FleetState.STARTING)
        )  # fmt: skip

    def ready(self, report: UpReporter) -> Callable[[ReplicaInfo], None]:
        """The on-ready callback: report the replica, then record it as ready (at its URL)."""

        def on_ready(info: ReplicaInfo) -> None:
            report.replica_ready(info)
            row = self.rows[info.replica_id]
            self.rows[info.replica_id] = replace(row, url=info.url, ready=True)
            self.write()

        return on_ready


async def _watch(
    replicas: LocalReplicas, pool: ReplicaPool, stop: asyncio.Event, report: UpReporter
) -> None:
    """Wait for the stop signal; warn once for each replica that dies meanwhile, and tell
    the gateway at once (its health checks would take `unhealthy_after` rounds)."""
    reported: set[str] = set()
    while not stop.is_set():
        for proc, code in replicas.exited():
            if proc.replica_id not in reported:
                reported.add(proc.replica_id)
                pool.mark_down(proc.replica_id, f"its process exited with code {code}")
                report.warn(
                    f"replica {proc.replica_id} exited with code {code}; the gateway routes "
                    f"around it (log: {proc.log_path})"
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), _WATCH_INTERVAL_S)


async def _run_on_ray(
    config: FleetConfig, report: UpReporter, detached_run_dir: Path | None
) -> None:
    # Imported here: Ray is an optional extra, and importing it takes seconds.
    try:
        from servepilot.fleet.ray.up import run_ray_up
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise FleetError(
            "cluster.backend: ray needs Ray, which is not installed",
            hint="pip install 'servepilot[ray]' (`make install` installs it)",
        ) from None
    await run_ray_up(config, report, detached_run_dir)


def stop_event() -> asyncio.Event:
    """Set by SIGINT or SIGTERM (Ctrl-C, `servepilot down`); the Ray backend's `up` too."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, event.set)
    return event
