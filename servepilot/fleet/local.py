"""Local replicas: N vLLM servers (or simulated replicas, `engine.kind: sim`) as child
processes of this one, each on its own free port. Both kinds are started, awaited and stopped
the same way (engine/process.py); vLLM replicas sharing a GPU start one after the other
(fleet/start_order.py)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from servepilot.core.config import FleetConfig
from servepilot.core.errors import EngineStartError
from servepilot.engine.args import (
    KvEventsPorts,
    LaunchCommand,
    cores_shared,
    split_cores,
)
from servepilot.engine.gpu.inventory import GpuInventory
from servepilot.engine.model_source import ResolvedModel
from servepilot.engine.process import ReplicaInfo, ReplicaProcess
from servepilot.engine.simserver.args import SimModel
from servepilot.fleet.autoscale.waits import StartWaits
from servepilot.fleet.backend import (
    Joined,
    Left,
    Lost,
    Replica,
    ReplicaEvent,
    ReplicaState,
    Synced,
)
from servepilot.fleet.devices import replica_devices, replica_slots
from servepilot.fleet.logs import replica_log_name
from servepilot.fleet.replica_launch import replica_command, replica_ports
from servepilot.fleet.start_order import StartStep, start_steps

log = logging.getLogger(__name__)

_EXIT_POLL_S = 1.0
"""How often the watch looks for replicas whose process exited."""


class LocalReplicas:
    """Owns the replica processes of one `up`: starts them together (the autoscaler one more,
    or stops one), stops them together."""

    def __init__(
        self,
        config: FleetConfig,
        model: ResolvedModel | SimModel,
        run_dir: Path,
        gpus: GpuInventory | None = None,
    ) -> None:
        """`gpus`: this node's GPUs (read from the node when not given, on GPU fleets).
        Raises ConfigError when the replicas need more GPUs than the node has."""
        self.config = config
        self.model = model
        self.run_dir = run_dir
        self.processes: list[ReplicaProcess] = []
        self._next_index = 0
        """The index of the next replica: an id (and its log file) is never given twice."""
        self._slot_of: dict[str, int] = {}
        self._ports_given: set[int] = set()
        """Every port handed to a replica of this `up`: the replicas bind theirs as they
        start, so until then the OS may offer one of them again."""
        self.devices = replica_devices(config, gpus)
        """Each replica slot's GPUs (CUDA_VISIBLE_DEVICES); None without GPUs."""
        self._steps: dict[str, StartStep] = {}
        """How each replica starts: at once, or after the one before it on its GPU."""
        self._started: dict[str, asyncio.Event] = {}
        """Set once a replica is done starting (ready, or stopped): the next on its GPU goes."""

    def core_slots(self) -> list[tuple[int, ...]]:
        """Each replica slot's cores: one per replica, or per replica at most when the fleet
        autoscales (a replica added later gets the cores of a slot, never all of them)."""
        slots = replica_slots(self.config)
        return split_cores(os.cpu_count() or 1, slots, self.config.engine.cpu_threads)

    def _process(self, index: int) -> ReplicaProcess:
        host = self.config.replicas.host
        port, kv_events = replica_ports(self.config, avoid=self._ports_given)
        self._ports_given.update(
            [port] if kv_events is None else [port, kv_events.publish, kv_events.replay]
        )
        replica_id = f"r{index}"
        slot = self._free_slot()
        self._slot_of[replica_id] = slot
        return ReplicaProcess(
            replica_id=replica_id,
            command=self._command(host, port, slot, kv_events),
            url=f"http://{host}:{port}",
            log_path=self.run_dir / replica_log_name(replica_id),
            kv_events=kv_events,
        )

    def _free_slot(self) -> int:
        """The first slot no live replica holds: an added replica never shares a running
        one's GPUs (slots wrap round only past the fleet's maximum)."""
        held = {self._slot_of.get(p.replica_id) for p in self.processes}
        slots = replica_slots(self.config)
        return next((s for s in range(slots) if s not in held), len(self._slot_of) % slots)

    def _build(self, count: int) -> list[ReplicaProcess]:
        self.processes = []
        self._slot_of = {}
        for index in range(count):
            self.processes.append(self._process(index))
        return self.processes

    def _command(
        self, host: str, port: int, slot: int, kv_events: KvEventsPorts | None
    ) -> LaunchCommand:
        slots = self.core_slots()
        cores = slots[slot % len(slots)]
        shared = cores_shared(os.cpu_count() or 1, len(slots), self.config.engine.cpu_threads)
        command = replica_command(self.config, self.model, host, port, cores, kv_events, shared)
        if self.devices is None:
            return command
        # Before the user's engine.env, which may still set its own.
        visible = self.devices.visible_devices(slot % len(self.devices.replicas))
        return LaunchCommand(command.argv, {"CUDA_VISIBLE_DEVICES": visible, **command.env})

    async def start(
        self, on_ready: Callable[[ReplicaInfo], None] | None = None
    ) -> list[ReplicaInfo]:
        """Start every replica and wait until all are ready; on any failure stop them all."""
        self.launch()
        return await self.wait_ready(on_ready)

    def launch(self, count: int | None = None) -> None:
        """Start `count` replicas' processes (default replicas.count) without waiting (their
        pids are known after this), except those that share a GPU with one launched before
        them: `wait_ready` starts each once the one before it on its GPU is ready."""
        self.processes = self._build(self.config.replicas.count if count is None else count)
        self._next_index = len(self.processes)
        slots = [(p.replica_id, self._slot_of[p.replica_id]) for p in self.processes]
        self._steps = {s.replica_id: s for s in start_steps(slots, self._sharing())}
        self._started = {p.replica_id: asyncio.Event() for p in self.processes}
        for proc in self.processes:
            if self._steps[proc.replica_id].after is None:
                proc.start()

    def launch_one(self) -> ReplicaProcess:
        """Start one more replica (the autoscaler's), under a new id, without waiting; await
        its `ready_one`, which first waits for a replica still starting on the same GPU."""
        index, self._next_index = self._next_index, self._next_index + 1
        proc = self._process(index)
        starting = [
            (p.replica_id, self._slot_of[p.replica_id])
            for p in self.processes
            if not self._started.get(p.replica_id, asyncio.Event()).is_set()
        ]
        (step,) = start_steps([(proc.replica_id, self._slot_of[proc.replica_id])],
                              self._sharing(), starting)  # fmt: skip
        self._steps[proc.replica_id] = step
        self._started[proc.replica_id] = asyncio.Event()
        self.processes.append(proc)
        if step.after is None:
            proc.start()
        return proc

    def _sharing(self) -> int:
        """Replicas per GPU group to stagger; 1 (all at once) without GPUs: a simulated
        replica profiles no device memory."""
        return 1 if self.devices is None else self.devices.replicas_per_gpu

    def deferred(self) -> tuple[str, ...]:
        """A line for each launched replica that waits for another to be ready first."""
        lines = (self.wait_line(p.replica_id) for p in self.processes)
        return tuple(line for line in lines if line is not None)

    def wait_line(self, replica_id: str) -> str | None:
        """The line `up` prints for a replica that waits for another on its GPU (r1 starts
        after r0 is ready: they share GPU 0); None for one that starts at once."""
        step = self._steps.get(replica_id)
        if step is None or step.after is None or self.devices is None:
            return None
        gpus = self.devices.visible_devices(self._slot_of[replica_id])
        plural = "s" if "," in gpus else ""
        return f"{replica_id} starts after {step.after} is ready: they share GPU{plural} {gpus}"

    async def ready_one(self, proc: ReplicaProcess) -> ReplicaInfo:
        """Start `proc` if it waited for another replica on its GPU (once that one is done
        starting), then wait until it is ready."""
        step = self._steps.get(proc.replica_id)
        if step is not None and step.after is not None:
            await self._started.setdefault(step.after, asyncio.Event()).wait()
            proc.start()
        info = await proc.wait_ready(self.config.engine.startup_timeout_s)
        self._done_starting(proc.replica_id)
        return info

    def _done_starting(self, replica_id: str) -> None:
        """`replica_id` no longer profiles its GPU (ready, or stopped): the next on it may
        go. A failed start does not count until the replica is stopped: `up` then stops
        them all, and the autoscaler stops it (stop_one)."""
        self._started.setdefault(replica_id, asyncio.Event()).set()

    async def stop_one(self, replica_id: str) -> None:
        """Stop one replica (SIGTERM, SIGKILL after the grace period) and forget it."""
        proc = next((p for p in self.processes if p.replica_id == replica_id), None)
        if proc is None:
            return
        self.processes.remove(proc)
        await asyncio.to_thread(proc.stop, self.config.engine.stop_grace_s)
        self._done_starting(replica_id)

    async def wait_ready(
        self, on_ready: Callable[[ReplicaInfo], None] | None = None
    ) -> list[ReplicaInfo]:
        """Wait until every launched replica is ready (starting those that waited for
        another on their GPU); on any failure stop them all."""

        async def ready(proc: ReplicaProcess) -> ReplicaInfo:
            info = await self.ready_one(proc)
            if on_ready is not None:
                on_ready(info)
            return info

        waits = [asyncio.ensure_future(ready(p)) for p in self.processes]
        try:
            return list(await asyncio.gather(*waits))
        except (EngineStartError, asyncio.CancelledError):
            # Replicas still waiting for a GPU's turn would otherwise wait forever.
            for wait in waits:
                wait.cancel()
            await self.stop()
            raise

    def exited(self) -> list[tuple[ReplicaProcess, int]]:
        """Replicas whose process has exited, with their exit codes."""
        return [(p, code) for p in self.processes if (code := p.exit_code()) is not None]

    async def stop(self) -> None:
        """Stop all replicas in parallel (SIGTERM, then SIGKILL after the grace period)."""
        grace_s = self.config.engine.stop_grace_s
        # All at once first: the waits below run a few at a time (the default thread pool),
        # and dozens of replicas (simulated ones) would otherwise stop batch after batch.
        for proc in self.processes:
            proc.terminate()
        await asyncio.gather(*(asyncio.to_thread(p.stop, grace_s) for p in self.processes))


class LocalBackend:
    """`cluster.backend: local` as a `ReplicaBackend`: replicas are child processes of this
    one (`LocalReplicas`). Its watch says `Joined` once a replica is ready and `Lost` once its
    process exits (looked for every `poll_s`); a replica added later (the autoscaler's) joins
    the same way, and one that fails to start is logged, stopped and listed as failed until
    `stop` forgets it (the controller counts it, and replaces it once)."""

    def __init__(
        self,
        replicas: LocalReplicas,
        capacity: Callable[[ReplicaInfo], int | None],
        poll_s: float = _EXIT_POLL_S,
    ) -> None:
        """`capacity`: a ready replica's concurrency budget at the gateway."""
        self.replicas = replicas
        self._capacity = capacity
        self._poll_s = poll_s
        self._launched = False
        self._ready: dict[str, ReplicaInfo] = {}
        self._exited: dict[str, int] = {}
        self._failed: dict[str, Replica] = {}
        self._waits = StartWaits()
        self._watchers: list[asyncio.Queue[ReplicaEvent]] = []

    @property
    def sleep_mode(self) -> bool:
        return self.replicas.config.engine.sleep_mode

    async def start(self, count: int = 1) -> tuple[str, ...]:
        if not self._launched:
            self._launched = True
            self.replicas.launch(count)
            return tuple(p.replica_id for p in self.replicas.processes)
        return tuple(self._add() for _ in range(count))

    def _add(self) -> str:
        proc = self.replicas.launch_one()
        rid = proc.replica_id
        if (line := self.replicas.wait_line(rid)) is not None:
            log.info("autoscale: %s", line)
        self._waits.start(rid, self._join_when_ready(proc))
        return rid

    async def _join_when_ready(self, proc: ReplicaProcess) -> None:
        rid = proc.replica_id
        try:
            # Through the replicas: one sharing a GPU starts once its neighbour is ready.
            info = await self.replicas.ready_one(proc)
        except Exception as exc:  # EngineStartError
            log.warning("autoscale: replica %s did not start: %s", rid, exc)
            self._waits.discard(rid)
            await self.replicas.stop_one(rid)
            self._failed[rid] = Replica(rid, proc.url, ReplicaState.FAILED, 0, str(proc.log_path))
            return
        self._waits.discard(rid)
        self._became_ready(info)
        log.info("autoscale: replica %s ready in %.0f s, joining the gateway", rid, info.startup_s)

    async def wait_started(self, on_ready: Callable[[ReplicaInfo], None]) -> list[ReplicaInfo]:
        def ready(info: ReplicaInfo) -> None:
            self._became_ready(info)
            on_ready(info)

        return await self.replicas.wait_ready(ready)

    def _became_ready(self, info: ReplicaInfo) -> None:
        self._ready[info.replica_id] = info
        self._publish(self._joined(info))

    def _joined(self, info: ReplicaInfo) -> Joined:
        return Joined(info.replica_id, info.url, self._capacity(info), info.kv_events)

    async def stop(self, replica_id: str) -> None:
        self._failed.pop(replica_id, None)
        await self._waits.cancel(replica_id)
        was_ready = self._ready.pop(replica_id, None) is not None
        await self.replicas.stop_one(replica_id)
        self._exited.pop(replica_id, None)
        if was_ready:  # drained already (the controller's): nothing left to finish
            self._publish(Left(replica_id, drain_timeout_s=0.0, why="stopped"))

    async def stop_all(self) -> None:
        await self._waits.cancel_all()
        await self.replicas.stop()

    async def close(self) -> None:
        await self._waits.cancel_all()

    def list(self) -> tuple[Replica, ...]:
        return tuple(
            Replica(p.replica_id, p.url, self._state(p.replica_id), p.pid or 0, str(p.log_path))
            for p in self.replicas.processes
        ) + tuple(self._failed.values())

    def _state(self, replica_id: str) -> ReplicaState:
        if replica_id in self._exited:
            return ReplicaState.LOST
        return ReplicaState.READY if replica_id in self._ready else ReplicaState.STARTING

    async def watch(self) -> AsyncIterator[ReplicaEvent]:
        queue: asyncio.Queue[ReplicaEvent] = asyncio.Queue()
        for info in self._ready.values():
            queue.put_nowait(self._joined(info))
        queue.put_nowait(Synced())
        self._watchers.append(queue)
        try:
            while True:
                self._look_for_exits()
                try:
                    event = await asyncio.wait_for(queue.get(), self._poll_s)
                except TimeoutError:
                    continue
                yield event
        finally:
            self._watchers.remove(queue)

    def _look_for_exits(self) -> None:
        for proc, code in self.replicas.exited():
            rid = proc.replica_id
            if rid not in self._exited:
                self._exited[rid] = code
                why = f"its process exited with code {code}"
                self._publish(Lost(rid, why, str(proc.log_path)))

    def _publish(self, event: ReplicaEvent) -> None:
        for queue in self._watchers:
            queue.put_nowait(event)
