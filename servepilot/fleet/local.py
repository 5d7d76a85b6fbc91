"""Local replicas: N vLLM servers (or simulated replicas, `engine.kind: sim`) as child
processes of this one, each on its own free port. Both kinds are started, awaited and stopped
the same way (engine/process.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

from servepilot.core.config import FleetConfig
from servepilot.core.errors import EngineStartError
from servepilot.engine.args import LaunchCommand, ServerSpec, launch_command, split_cores
from servepilot.engine.gpu.inventory import GpuInventory
from servepilot.engine.model_source import ResolvedModel
from servepilot.engine.process import ReplicaInfo, ReplicaProcess, free_port
from servepilot.engine.simserver.args import SimModel, sim_launch_command
from servepilot.fleet.devices import replica_devices, replica_slots
from servepilot.fleet.logs import replica_log_name


def replica_command(
    config: FleetConfig,
    model: ResolvedModel | SimModel,
    host: str,
    port: int,
    cores: tuple[int, ...],
) -> LaunchCommand:
    """One replica's server command: vLLM's, or the simulated replica's (`engine.kind: sim`);
    the Ray backend's actors start theirs with it too."""
    if isinstance(model, SimModel):
        return sim_launch_command(config, model, host, port)
    spec = ServerSpec(str(model.path), model.served_name, host, port, dummy_weights=model.dummy)
    return launch_command(config.engine, spec, config.hardware.device, cores)


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
        self.devices = replica_devices(config, gpus)
        """Each replica slot's GPUs (CUDA_VISIBLE_DEVICES); None without GPUs."""

    def core_slots(self) -> list[tuple[int, ...]]:
        """Each replica slot's cores: one per replica, or per replica at most when the fleet
        autoscales (a replica added later gets the cores of a slot, never all of them)."""
        slots = replica_slots(self.config)
        return split_cores(os.cpu_count() or 1, slots, self.config.engine.cpu_threads)

    def _process(self, index: int) -> ReplicaProcess:
        host = self.config.replicas.host
        port = free_port(host)
        replica_id = f"r{index}"
        slot = self._free_slot()
        self._slot_of[replica_id] = slot
        return ReplicaProcess(
            replica_id=replica_id,
            command=self._command(host, port, slot),
            url=f"http://{host}:{port}",
            log_path=self.run_dir / replica_log_name(replica_id),
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

    def _command(self, host: str, port: int, slot: int) -> LaunchCommand:
        slots = self.core_slots()
        command = replica_command(self.config, self.model, host, port, slots[slot % len(slots)])
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
        pids are known after this)."""
        self.processes = self._build(self.config.replicas.count if count is None else count)
        self._next_index = len(self.processes)
        for proc in self.processes:
            proc.start()

    def launch_one(self) -> ReplicaProcess:
        """Start one more replica (the autoscaler's), under a new id, without waiting; await
        its `wait_ready`."""
        index, self._next_index = self._next_index, self._next_index + 1
        proc = self._process(index)
        self.processes.append(proc)
        proc.start()
        return proc

    async def stop_one(self, replica_id: str) -> None:
        """Stop one replica (SIGTERM, SIGKILL after the grace period) and forget it."""
        proc = next((p for p in self.processes if p.replica_id == replica_id), None)
        if proc is None:
            return
        self.processes.remove(proc)
        await asyncio.to_thread(proc.stop, self.config.engine.stop_grace_s)

    async def wait_ready(
        self, on_ready: Callable[[ReplicaInfo], None] | None = None
    ) -> list[ReplicaInfo]:
        """Wait until every launched replica is ready; on any failure stop them all."""
        timeout_s = self.config.engine.startup_timeout_s

        async def ready(proc: ReplicaProcess) -> ReplicaInfo:
            info = await proc.wait_ready(timeout_s)
            if on_ready is not None:
                on_ready(info)
            return info

        try:
            return list(await asyncio.gather(*(ready(p) for p in self.processes)))
        except (EngineStartError, asyncio.CancelledError):
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
