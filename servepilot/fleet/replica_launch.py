"""One replica's launch, the same whatever starts it (the local backend's child processes,
the Ray backend's actors): its server command, vLLM's or the simulated replica's, and the
ports it serves and publishes its KV events on."""

from __future__ import annotations

from collections.abc import Collection

from servepilot.core.config import FleetConfig
from servepilot.engine.args import (
    KvEventsPorts,
    LaunchCommand,
    ServerSpec,
    launch_command,
    weights_env,
)
from servepilot.engine.model_source import ResolvedModel
from servepilot.engine.ports import free_ports
from servepilot.engine.simserver.args import SimModel, sim_launch_command


def replica_command(
    config: FleetConfig,
    model: ResolvedModel | SimModel,
    host: str,
    port: int,
    cores: tuple[int, ...],
    kv_events: KvEventsPorts | None = None,
    cores_shared: bool = False,
) -> LaunchCommand:
    """One replica's server command: vLLM's, or the simulated replica's (`engine.kind: sim`);
    the Ray backend's actors start theirs with it too."""
    if isinstance(model, SimModel):
        return sim_launch_command(config, model, host, port, kv_events)
    spec = ServerSpec(
        str(model.path), model.served_name, host, port, model.dummy, kv_events=kv_events
    )
    command = launch_command(config.engine, spec, config.hardware.device, cores, cores_shared)
    return LaunchCommand(command.argv, weights_env(config) | command.env)


ANY_ADDRESS = "0.0.0.0"
"""Where a replica's ports are picked: vLLM binds its KV event sockets on every address
(`tcp://*:port`), so a port free on the replica's own address alone is not enough (one in use
on 127.0.0.1 failed a replica on another address: "Address already in use")."""


def replica_ports(
    config: FleetConfig, avoid: Collection[int] = ()
) -> tuple[int, KvEventsPorts | None]:
    """A replica's HTTP port and its KV events' two (engine.kv_events, simulated replicas'
    too; None for none), all different, none of `avoid`, free on every address."""
    if not config.engine.kv_events:
        return free_ports(1, ANY_ADDRESS, avoid=avoid)[0], None
    port, publish, replay = free_ports(3, ANY_ADDRESS, avoid=avoid)
    return port, KvEventsPorts(publish, replay)
