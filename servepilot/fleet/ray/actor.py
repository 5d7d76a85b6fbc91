"""The replica actor: runs on a Ray node in bundle 0 of its replica's placement group and owns
the replica's server process there, started with the same command local replicas use
(fleet/replica_launch.py `replica_command`, engine/process.py `ReplicaProcess`).

Its life is the server's: when the server dies after it served, the actor exits so that Ray
restarts it (max_restarts), in the same placement group; when its node dies, Ray reschedules
the group and restarts the actor on another node. The server dies with the actor
(PR_SET_PDEATHSIG), so a lost actor leaves no server behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from servepilot.core.config import EngineKind, FleetConfig
from servepilot.core.errors import EngineStartError
from servepilot.engine.args import split_cores
from servepilot.engine.model_source import ResolvedModel, resolve_model
from servepilot.engine.process import ReplicaInfo, ReplicaProcess
from servepilot.engine.simserver.args import SimModel, sim_model
from servepilot.fleet.logs import replica_log_name
from servepilot.fleet.replica_launch import replica_command, replica_ports

# How often the actor looks at its server process once it serves.
_WATCH_S = 0.5


@dataclass(frozen=True, slots=True)
class ActorSpec:
    """What a replica actor is told when Ray (re)starts it."""

    config: FleetConfig
    replica_id: str
    run_dir: str
    engine_args: tuple[str, ...]
    """Placement's additions to the server's command line (vLLM's Ray executor)."""
    gpu_bundles: tuple[int, ...]
    """The bundle of the actor's group each of the replica's GPUs is leased from."""


@dataclass(frozen=True, slots=True)
class ActorReady:
    """What `ready()` answers: the replica's endpoint, or why its server did not start."""

    node_id: str
    node_ip: str
    incarnation: str
    """New each time Ray (re)starts the actor: a replica whose incarnation changed is learnt
    again by the gateway (it may be on another node, on another port)."""
    served_name: str
    """The model name clients send."""
    info: ReplicaInfo | None
    failure: str | None = None


class ReplicaServer:
    """Owns one replica's server on the node Ray placed it on (an async Ray actor)."""

    def __init__(self, spec: ActorSpec) -> None:
        self._spec = spec
        self._node_id = ray.get_runtime_context().get_node_id()
        self._node_ip = ray.util.get_node_ip_address()
        self._incarnation = uuid.uuid4().hex[:12]
        self._stopping = False
        self._ready: asyncio.Task[ActorReady] | None = None
        self._exited = asyncio.Event()
        # Held for the actor's life: each keeps one GPU of the group assigned to this replica.
        self._leases, gpu_ids = _lease_gpus(spec.gpu_bundles)
        self._process, self._served_name = _start_server(spec, self._node_ip, gpu_ids)

    async def ready(self) -> ActorReady:
        """Wait until the server answers /health (or failed to start)."""
        if self._ready is None:
            self._ready = asyncio.ensure_future(self._wait_ready())
        return await asyncio.shield(self._ready)

    async def until_exit(self) -> int:
        """Return the server's exit code when it exits (an owner awaits this to learn of it)."""
        await self._exited.wait()
        return self._process.exit_code() or 0

    def stop(self) -> None:
        """Stop the server for good (SIGTERM, SIGKILL after engine.stop_grace_s)."""
        self._stopping = True
        self._process.stop(self._spec.config.engine.stop_grace_s)

    async def _wait_ready(self) -> ActorReady:
        timeout_s = self._spec.config.engine.startup_timeout_s
        try:
            info = await self._process.wait_ready(timeout_s)
        except EngineStartError as exc:
            return self._answer(None, str(exc))
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._exit_with_server, args=(loop,), daemon=True).start()
        return self._answer(info, None)

    def _answer(self, info: ReplicaInfo | None, failure: str | None) -> ActorReady:
        return ActorReady(
            self._node_id, self._node_ip, self._incarnation, self._served_name, info, failure
        )

    def _exit_with_server(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._process.exit_code() is None:
            time.sleep(_WATCH_S)
        if not self._stopping:
            # An unexpected exit is what Ray restarts an actor for (an intentional one is not).
            os._exit(1)
        loop.call_soon_threadsafe(self._exited.set)


class GpuLease:
    """Sits in one GPU bundle of a replica's group so that Ray assigns that GPU to it."""

    def gpu_ids(self) -> list[str]:
        return [str(gpu) for gpu in ray.get_gpu_ids()]


def replica_actor_class() -> Any:
    return ray.remote(ReplicaServer)


def _lease_gpus(bundles: tuple[int, ...]) -> tuple[list[Any], str]:
    """One lease a GPU, from these bundles of the actor's group, and the GPUs' ids (what
    CUDA_VISIBLE_DEVICES takes)."""
    if not bundles:
        return [], ""
    group = get_current_placement_group()
    lease_class = ray.remote(GpuLease)
    leases = [
        lease_class.options(
            num_cpus=0,
            num_gpus=1,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                group, placement_group_bundle_index=bundle
            ),
        ).remote()
        for bundle in bundles
    ]
    ids = ray.get([lease.gpu_ids.remote() for lease in leases])
    return leases, ",".join(gpu for lease_ids in ids for gpu in lease_ids)


def _start_server(spec: ActorSpec, host: str, gpu_ids: str) -> tuple[ReplicaProcess, str]:
    config = spec.config
    engine = config.engine.model_copy(
        update={"extra_args": (*config.engine.extra_args, *spec.engine_args)}
    )
    config = config.model_copy(update={"engine": engine})
    model: ResolvedModel | SimModel
    if config.engine.kind is EngineKind.SIM:
        model = sim_model(config.model, config.engine.sim_tokenizer)
    else:
        model = resolve_model(config.model)
    port, kv_events = replica_ports(config)
    cores = split_cores(os.cpu_count() or 1, 1, config.engine.cpu_threads)[0]
    command = replica_command(config, model, host, port, cores, kv_events)
    if gpu_ids:
        command = dataclasses.replace(command, env={**command.env, "CUDA_VISIBLE_DEVICES": gpu_ids})
    log_path = Path(spec.run_dir) / replica_log_name(spec.replica_id)
    _keep_previous(log_path)
    url = f"http://{host}:{port}"
    process = ReplicaProcess(spec.replica_id, command, url, log_path, kv_events)
    process.start()
    return process, model.served_name


def _keep_previous(log_path: Path) -> None:
    """A restarted replica's log starts afresh; the one before keeps its time in its name."""
    with contextlib.suppress(FileNotFoundError):
        stamp = time.strftime("%H%M%S", time.localtime(log_path.stat().st_mtime))
        log_path.rename(log_path.with_name(f"{log_path.stem}-until-{stamp}.log"))
