"""`up`: the replicas and the gateway in front of them, from start to an ordered shutdown,
through one `ReplicaBackend` (local processes, or Ray actors: `fleet.ray.launch`) and one
serve lifecycle, the same for both.

Order of start: the backend prepared (the model resolved, or the Ray cluster joined) -> fleet
record (`starting`) -> replicas launched -> replicas ready -> gateway, its membership fed from
the backend's watch -> warm pool's sleepers (or parked replicas) -> fleet record (`serving`) -> with
`autoscale.enabled`, the autoscaler (its replicas join through the same watch).
Order of stop, the reverse: autoscaler -> record -> membership feed -> gateway (drain
in-flight work) -> replicas. Stopped while starting: the replicas are stopped, then the record
goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import signal
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
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
    pool_parks,
)
from servepilot.core.errors import FleetError
from servepilot.core.loop import cancel_and_wait
from servepilot.engine.model_source import ResolvedModel, resolve_model
from servepilot.engine.process import ReplicaInfo
from servepilot.engine.simserver.args import SimModel, sim_model
from servepilot.fleet.autoscale.controller import AutoscaleController
from servepilot.fleet.autoscale.start import check_autoscale, initial_replicas, start_autoscaler
from servepilot.fleet.backend import Lost, ReplicaBackend, ReplicaEvent
from servepilot.fleet.launched import launched_fleet
from servepilot.fleet.local import LocalBackend, LocalReplicas
from servepilot.fleet.logs import ACCESS_LOG, gateway_log, new_run_dir
from servepilot.fleet.membership import MembershipFeed
from servepilot.fleet.records import ServingRecord, StartingRecord
from servepilot.fleet.serve import (
    FleetLaunch,
    ServedGateway,
    fleet_facts,
    kv_index_settings,
    replica_budget,
    reserve_port,
    start_gateway,
)
from servepilot.fleet.state import ReplicaRecord, check_no_fleet, remove_record
from servepilot.fleet.warm_pool import put_to_sleep, record_rows, replicas_to_sleep
from servepilot.gateway import Gateway
from servepilot.routing import StepTimeModel

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
    config: FleetConfig,
    report: UpReporter,
    detached_run_dir: Path | None = None,
    step_model: Callable[[str], StepTimeModel] | None = None,
) -> None:
    """Serve until SIGINT or SIGTERM, then drain and stop everything. `detached_run_dir`:
    this is the process `up --detach` started, in the run folder it made (detach.py).
    `step_model(replica_id)`: each replica's step times, for the predicted_latency policy."""
    check_autoscale(config)
    check_warm_pool(config)
    launched = launched_fleet(config)
    if launched.note is not None:
        report.warn(launched.note)
    config = launched.config
    on_ray = config.cluster.backend is ClusterBackend.RAY
    prepare = _ray_fleet(config) if on_ray else _local_fleet
    gw = config.gateway
    with reserve_port(gw.host, gw.port):  # held while the replicas start
        check_no_fleet(gw.port)
        run_dir = detached_run_dir or new_run_dir()
        try:
            async with prepare(config, report, run_dir) as launch:
                detached = detached_run_dir is not None
                await _serve_fleet(config, launch, report, run_dir, detached, step_model)
        finally:
            remove_record(gw.port)


Prepare = Callable[
    [FleetConfig, "UpReporter", Path], contextlib.AbstractAsyncContextManager[FleetLaunch]
]


@contextlib.asynccontextmanager
async def _local_fleet(
    config: FleetConfig, report: UpReporter, run_dir: Path
) -> AsyncIterator[FleetLaunch]:
    """`cluster.backend: local`: the model resolved here, the replicas child processes."""
    model: ResolvedModel | SimModel
    if config.engine.kind is EngineKind.SIM:
        model = sim_model(config.model, config.engine.sim_tokenizer)
        what = "simulated"
    else:
        # Converting the embedded model takes tens of seconds the first time: off the loop.
        model = await asyncio.to_thread(resolve_model, config.model, progress=report.step)
        what = "vLLM"
    replicas = LocalReplicas(config, model, run_dir)
    if replicas.devices is not None:
        report.step(f"GPUs per replica: {replicas.devices.describe()}")
    count = initial_replicas(config)
    report.step(f"starting {count} {what} replica(s); logs in {run_dir}")

    def deferred() -> None:
        for line in replicas.deferred():
            report.step(line)

    yield FleetLaunch(
        LocalBackend(replicas, lambda info: replica_budget(config, info)),
        count,
        lambda: model.served_name,
        access_log=run_dir / ACCESS_LOG,
        stop_line="draining the gateway and stopping the replicas",
        after_start=deferred,
        tokenizer=_tokenizer(model),
    )


def _tokenizer(model: ResolvedModel | SimModel) -> str | None:
    """The folder whose tokenizer keys prompts for the gateway's exact index: the one the
    replicas count tokens with (a simulated replica's may be none: it approximates)."""
    if isinstance(model, SimModel):
        return None if model.tokenizer is None else str(model.tokenizer)
    return str(model.path)


def _ray_fleet(config: FleetConfig) -> Prepare:
    """`cluster.backend: ray`: refused here, before anything starts, when Ray is missing."""
    # Imported here: Ray is an optional extra, and importing it takes seconds.
    try:
        from servepilot.fleet.ray.launch import ray_fleet
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise FleetError(
            "cluster.backend: ray needs Ray, which is not installed",
            hint="pip install 'servepilot[ray]' (`make install` installs it)",
        ) from None

    @contextlib.asynccontextmanager
    async def prepare(
        config: FleetConfig, report: UpReporter, run_dir: Path
    ) -> AsyncIterator[FleetLaunch]:
        async with ray_fleet(config, report.step, report.warn, run_dir) as launch:
            yield launch

    return prepare


async def _serve_fleet(
    config: FleetConfig,
    launch: FleetLaunch,
    report: UpReporter,
    run_dir: Path,
    detached: bool,
    step_model: Callable[[str], StepTimeModel] | None,
) -> None:
    """The one serve lifecycle: launch, wait ready, serve, supervise, stop in order."""
    gw = config.gateway
    starting = StartingRecord(f"http://{gw.host}:{gw.port}", gw.port, run_dir,
                              _awaited(launch.backend))  # fmt: skip
    # After the backend is prepared: ray.init installs signal handlers of its own.
    stop = stop_event()
    infos = await until_stopped(_bring_up(launch, starting, report), stop)
    if infos is not None:
        with gateway_log(run_dir):
            await _serve(config, launch, infos, stop, report, run_dir, detached, step_model)


async def _bring_up(
    launch: FleetLaunch, starting: StartingRecord, report: UpReporter
) -> list[ReplicaInfo]:
    backend = launch.backend
    await backend.start(launch.count)
    starting.await_rows(_awaited(backend))  # their pids (local) are known now
    launch.after_start()
    return await backend.wait_started(starting.ready(report.replica_ready))


def _awaited(backend: ReplicaBackend) -> list[ReplicaRecord]:
    return [ReplicaRecord(r.replica_id, r.url, r.pid, r.log_path, ready=False)
            for r in backend.list()]  # fmt: skip


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
    launch: FleetLaunch,
    infos: list[ReplicaInfo],
    stop: asyncio.Event,
    report: UpReporter,
    run_dir: Path,
    detached: bool,
    step_model: Callable[[str], StepTimeModel] | None,
) -> None:
    """Start the gateway in front of the ready replicas and serve until told to stop."""
    backend = launch.backend
    served: ServedGateway | None = None
    feed: MembershipFeed | None = None
    autoscaler: AutoscaleController | None = None

    async def members(gateway: Gateway) -> None:
        nonlocal feed
        feed = MembershipFeed(backend.watch(), gateway.membership, lost_warning(report))
        await feed.start()

    try:
        gateway_config = kv_index_settings(config, launch.tokenizer)
        served = await start_gateway(gateway_config, [], launch.access_log,
                                     fleet_facts(config), members, step_model)  # fmt: skip
        if served.port != config.gateway.port:  # port 0: the OS picked one
            remove_record(config.gateway.port)
        pool = served.gateway.pool
        served.gateway.warm.parks = pool_parks(config)
        if backend.sleep_mode or served.gateway.warm.parks:
            sleepers = replicas_to_sleep([i.replica_id for i in infos], config.replicas.asleep)
            await put_to_sleep(served.gateway.warm, sleepers, report.step, report.warn)
        # Announced first, then recorded: a script (or test) that waits for the record's
        # `serving` finds the endpoint already printed.
        dummy = config.model.weights is Weights.DUMMY
        report.serving(UpStarted(served.url, launch.model_name(), tuple(infos), detached, dummy))
        record = ServingRecord(served, run_dir, lambda: record_rows(backend.list(), pool), config)
        record.write()
        served.gateway.warm.on_change(lambda _: record.write())
        if config.autoscale.enabled:
            cold_start_s = max(i.startup_s for i in infos)
            autoscaler = start_autoscaler(config, served.gateway, backend, cold_start_s,
                                          record.on_decision(report.step),
                                          config.replicas.asleep)  # fmt: skip
        await (launch.supervise or _until_stopped)(served, stop)
    finally:
        if autoscaler is not None:
            await autoscaler.stop()  # first: nothing starts, stops or rewrites the record after
        if served is not None:
            remove_record(served.port)
        report.step(launch.stop_line)
        if feed is not None:
            await feed.stop()  # before the gateway: no replica joins a gateway that stops
        if served is not None:
            await served.stop(DRAIN_TIMEOUT_S)
        await backend.stop_all()


async def _until_stopped(served: ServedGateway, stop: asyncio.Event) -> None:
    await stop.wait()


def lost_warning(report: UpReporter) -> Callable[[ReplicaEvent], None]:
    """Warn once of each replica whose process exited (the gateway marked it down at once:
    its health checks would take `unhealthy_after` rounds)."""

    def heard(event: ReplicaEvent) -> None:
        if isinstance(event, Lost):
            where = f" (log: {event.log_path})" if event.log_path else ""
            report.warn(
                f"replica {event.replica_id} lost: {event.why}; the gateway routes around it{where}"
            )

    return heard


def stop_event() -> asyncio.Event:
    """Set by SIGINT or SIGTERM (Ctrl-C, `servepilot down`)."""
    event = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, event.set)
    return event
