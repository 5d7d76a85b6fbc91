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
from servepilot.engine.model_source import ResolvedModel
from servepilot.engine.process import ReplicaInfo, ReplicaProcess, free_port
from servepilot.engine.simserver.args import SimModel, sim_launch_command
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
    spec = ServerSpec(str(model.path), model.served_name, host, port)
    return launch_command(config.engine, spec, config.hardware.device, cores)


class LocalReplicas:
    """Owns the replica processes of one `up`: starts them together, stops them together."""

    def __init__(self, config: FleetConfig, model: ResolvedModel | SimModel, run_dir: Path) -> None:
        self.config = config
        self.model = model
        self.run_dir = run_dir
        self.processes: list[ReplicaProcess] = []

    def _build(self) -> list[ReplicaProcess]:
        count = self.config.replicas.count
        host = self.config.replicas.host
        cores = split_cores(os.cpu_count() or 1, count, self.config.engine.cpu_threads)
        processes = []
        for index in range(count):
            port = free_port(host)
            command = self._command(host, port, cores[index])
            processes.append(
                ReplicaProcess(
                    replica_id=f"r{index}",
                    command=command,
                    url=f"http://{host}:{port}",
                    log_path=self.run_dir / replica_log_name(f"r{index}"),
                )
            )
        return processes

    def _command(self, host: str, port: int, cores: tuple[int, ...]) -> LaunchCommand:
        return replica_command(self.config, self.model, host, port, cores)

    async def start(
        self, on_ready: Callable[[ReplicaInfo], None] | None = None
    ) -> list[ReplicaInfo]:
        """Start every replica and wait until all are ready; on any failure stop them all."""
        self.launch()
        return await self.wait_ready(on_ready)

    def launch(self) -> None:
        """Start every replica's process without waiting (their pids are known after this)."""
        self.processes = self._build()
        for proc in self.processes:
            proc.start()

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
