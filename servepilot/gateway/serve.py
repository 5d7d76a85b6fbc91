"""Running a gateway as the foreground process (what the CLI calls)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from servepilot.core import loop
from servepilot.core.config import GatewayConfig
from servepilot.gateway.app import Gateway
from servepilot.gateway.fleet_gauges import FleetFacts
from servepilot.routing import StepTimeModel
from servepilot.routing.base import RoutingPolicy

log = logging.getLogger(__name__)

Alongside = Callable[[Gateway], AbstractAsyncContextManager[object]]
"""What runs beside a serving gateway, given it: its members' feed (entered before it listens,
`gateway.membership` fed from a replica backend's watch: fleet.membership, which the gateway
may not import) or the autoscaler in a cluster (entered once it listens)."""


def run_gateway(
    config: GatewayConfig,
    replicas: Sequence[tuple[str, str]],
    *,
    policy: RoutingPolicy | None = None,
    drain_timeout_s: float = 30.0,
    on_started: Callable[[int], None] | None = None,
    access_log_path: Path | None = None,
    members: Alongside | None = None,
    facts: FleetFacts | None = None,
    alongside: Alongside | None = None,
    step_model: Callable[[str], StepTimeModel] | None = None,
) -> None:
    """Serve `replicas` ((replica_id, url) pairs) and those `members` feeds in, until
    SIGINT/SIGTERM, then drain and stop. With `facts`, /metrics has the batch utilisation and
    cost gauges; `alongside` runs while the gateway serves (see `serve`).

    Runs its own event loop, on uvloop when it is installed, and owns its process: once it
    listens, what it has built to serve is frozen out of the garbage collector's walks
    (`freeze_when_started`).
    """
    loop.run(
        serve(
            config,
            replicas,
            policy=policy,
            drain_timeout_s=drain_timeout_s,
            on_started=freeze_when_started(on_started),
            access_log_path=access_log_path,
            members=members,
            facts=facts,
            alongside=alongside,
            step_model=step_model,
        )
    )


def freeze_when_started(
    on_started: Callable[[int], None] | None,
) -> Callable[[int], None]:
    """`on_started`, after moving every object alive to the collector's permanent generation.

    By then the gateway has built what it keeps for its life: the modules, and for the exact
    index the model's tokenizer. When that came through transformers (which imports torch:
    about 390,000 objects), each full collection walked them all, about 260 ms with the event
    loop stopped, whenever the caches had grown enough; a profile of the exact router under
    load found 14% of its CPU there. Frozen, a collection walks only what serving has made
    since. For the process that
    serves alone (`run_gateway`): a test or an embedding process keeps its collector."""

    def started(port: int) -> None:
        gc.freeze()
        if on_started is not None:
            on_started(port)

    return started


async def serve(
    config: GatewayConfig,
    replicas: Sequence[tuple[str, str]],
    *,
    policy: RoutingPolicy | None = None,
    drain_timeout_s: float = 30.0,
    on_started: Callable[[int], None] | None = None,
    stop: asyncio.Event | None = None,
    access_log_path: Path | None = None,
    members: Alongside | None = None,
    facts: FleetFacts | None = None,
    alongside: Alongside | None = None,
    step_model: Callable[[str], StepTimeModel] | None = None,
) -> None:
    """Start a gateway in front of `replicas` (running ones), and of the replicas `members`
    feeds in as they come and go, and serve until `stop` is set (by default: until SIGINT or
    SIGTERM). `members(gateway)` is entered before the gateway listens, `alongside(gateway)`
    once it listens; both are left, `alongside` first, before the gateway stops, so that no
    replica joins a gateway that is stopping."""
    stop = stop if stop is not None else _stop_on_signals()
    gateway = Gateway(config, policy, access_log_path=access_log_path, step_model=step_model)
    if facts is not None:
        gateway.metrics.know_fleet(facts)
    try:
        async with contextlib.AsyncExitStack() as stack:
            # Probe every replica before listening, so /ready is right from the first request.
            await asyncio.gather(*(gateway.membership.join(rid, url) for rid, url in replicas))
            if members is not None:
                await stack.enter_async_context(members(gateway))
            port = await gateway.start()
            if on_started is not None:
                on_started(port)
            if alongside is not None:
                await stack.enter_async_context(alongside(gateway))
            await stop.wait()
    finally:
        await gateway.stop(drain_timeout_s)


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not available on Windows
            loop.add_signal_handler(signum, stop.set)
    return stop
