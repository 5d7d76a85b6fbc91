"""Start the gateway in front of the replicas `up` launched; what a backend's preparation
hands `up`'s serve lifecycle (`FleetLaunch`)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import socket
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from servepilot.core.config import Device, FleetConfig, GatewayConfig
from servepilot.core.errors import ConfigError, FleetError
from servepilot.engine.process import ReplicaInfo
from servepilot.fleet.backend import ReplicaBackend
from servepilot.gateway import FleetFacts, Gateway
from servepilot.plan.hardware import get_accelerator, load_catalog
from servepilot.plan.request import fleet_vllm_defaults
from servepilot.routing import StepTimeModel
from servepilot.routing.admission.budget import max_num_seqs, replica_capacity


@dataclass(frozen=True, slots=True)
class ServedGateway:
    gateway: Gateway
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self, drain_timeout_s: float) -> None:
        await self.gateway.stop(drain_timeout_s)


def _no_step() -> None:
    pass


@dataclass(frozen=True, slots=True)
class FleetLaunch:
    """A backend made ready to start (the model resolved, or the Ray cluster joined), with
    what the serve lifecycle needs of it beyond the `ReplicaBackend` protocol."""

    backend: ReplicaBackend
    count: int
    """Replicas to start with."""
    model_name: Callable[[], str]
    """The served model's name, asked once the replicas are ready."""
    access_log: Path | None
    """The gateway's access log when gateway.access_log.path is unset."""
    stop_line: str
    """What `up` says as it stops."""
    after_start: Callable[[], None] = _no_step
    """Called once the replicas are launched (local: which wait for a GPU's turn)."""
    supervise: Callable[[ServedGateway, asyncio.Event], Awaitable[None]] | None = None
    """Runs while the fleet serves, until the stop event (Ray: `status`'s cluster view);
    by default the lifecycle only waits for the stop event."""
    tokenizer: str | None = None
    """The served model's folder, whose tokenizer the gateway's exact prefix index needs;
    None: gateway.kv_index.tokenizer as configured."""


def replica_budget(config: FleetConfig, info: ReplicaInfo) -> int:
    """A ready replica's concurrency budget at the gateway, from the KV capacity it logged."""
    kv = info.kv.kv_capacity_tokens if info.kv else None
    return replica_capacity(config, fleet_vllm_defaults(config), kv)


def kv_index_settings(config: FleetConfig, tokenizer: str | None) -> GatewayConfig:
    """The gateway's config with its exact prefix index set to the fleet's replicas: their
    block size (the configured one, else vLLM's default on the device) and the model's
    tokenizer, unless the user named one. Replicas that publish no KV events are guessed."""
    settings = config.gateway.kv_index
    if not config.engine.kv_events:
        return config.gateway
    block_size = config.engine.block_size or fleet_vllm_defaults(config).block_size_tokens
    update = {"block_size": block_size, "tokenizer": settings.tokenizer or tokenizer}
    seed = config.engine.env.get("PYTHONHASHSEED")
    if seed is not None:
        update["hash_seed"] = seed
    return config.gateway.model_copy(update={"kv_index": settings.model_copy(update=update)})


def check_port_free(host: str, port: int) -> None:
    """Fail early if the gateway's port is taken."""
    with reserve_port(host, port):
        pass


@contextlib.contextmanager
def reserve_port(host: str, port: int) -> Iterator[None]:
    """Fail early, before minutes of replica startup, if the gateway's port is taken, and
    hold it till the block ends: bound, not listening, so the gateway (SO_REUSEADDR, as
    aiohttp binds) can listen on it meanwhile, while the kernel gives it to no ephemeral
    bind or outgoing connection. Without the hold, a test's free port was once taken during
    the replicas' start ("address already in use" once they were up, 2026-12-07)."""
    if port == 0:
        yield
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise FleetError(
                    f"port {port} on {host} is already in use",
                    hint="pass --port with another port, or stop what listens there "
                    "(`servepilot status` shows the fleets servepilot started)",
                ) from None
            raise FleetError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        yield


@dataclass(frozen=True, slots=True)
class Upstream:
    replica_id: str
    url: str
    capacity: int | None = None
    """Concurrency budget (None: the gateway's default)."""


def fleet_facts(config: FleetConfig) -> FleetFacts:
    """max_num_seqs and a replica's hourly price, for the gateway's batch and cost gauges."""
    seqs = max_num_seqs(config, fleet_vllm_defaults(config))
    return FleetFacts(seqs, _replica_usd_per_hour(config))


def _replica_usd_per_hour(config: FleetConfig) -> float | None:
    """A GPU replica pays for the GPUs it holds (TP x PP x DP), its share of them when
    replicas share GPUs; CPU replicas split the hosts they share. None when the accelerator
    is not in the catalog."""
    hw, engine = config.hardware, config.engine
    try:
        catalog = load_catalog(Path(hw.catalog)) if hw.catalog else None
        price = hw.price_usd_per_hour or get_accelerator(hw.accelerator, catalog).price_usd_per_hour
    except ConfigError:
        return None
    if hw.device is Device.CPU:
        return price * hw.count * hw.nodes / config.replicas.count
    gpus = engine.tensor_parallel_size * engine.pipeline_parallel_size
    return price * gpus * engine.data_parallel_size / hw.replicas_per_gpu


async def start_gateway(
    config: GatewayConfig,
    replicas: list[Upstream],
    run_access_log: Path | None = None,
    facts: FleetFacts | None = None,
    members: Callable[[Gateway], Awaitable[None]] | None = None,
    step_model: Callable[[str], StepTimeModel] | None = None,
) -> ServedGateway:
    """Start the gateway in front of `replicas`; returns where it listens. Its access log goes
    to gateway.access_log.path when set, else to `run_access_log`. With `facts`, it exports
    batch utilisation and cost per QPS. `members(gateway)` runs before it listens (`up` feeds
    its membership from the backend's watch), so /ready is right from the first request.
    `step_model(replica_id)`: each replica's step times, for the predicted_latency policy."""
    configured = config.access_log.path
    gateway = Gateway(
        config,
        access_log_path=Path(configured) if configured else run_access_log,
        step_model=step_model,
    )
    if facts is not None:
        gateway.metrics.know_fleet(facts)
    await asyncio.gather(*(gateway.pool.add(r.replica_id, r.url, r.capacity) for r in replicas))
    if members is not None:
        await members(gateway)
    try:
        port = await gateway.start()
    except OSError as exc:
        await gateway.stop(0)
        raise FleetError(
            f"the gateway cannot listen on {config.host}:{config.port}: {exc.strerror}"
        ) from None
    return ServedGateway(gateway=gateway, host=config.host, port=port)
