"""A node lost under load, on a local multi-node Ray cluster (ray_cluster.py): simulated
replicas behind the gateway, a stream of requests, one replica's node taken away, until the
replica serves again on another node. tests/integration/test_ray_backend.py asserts on what
it returns; bench_ray.py's recovery part times it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import ray
from prometheus_client.parser import text_string_to_metric_families
from ray.cluster_utils import Cluster

from servepilot.core.config import FleetConfig
from servepilot.fleet.backend import ReplicaState
from servepilot.fleet.membership import following
from servepilot.fleet.ray.actor import ActorReady
from servepilot.fleet.ray.backend import RayBackend
from servepilot.fleet.ray.replicas import RayReplicas
from servepilot.fleet.serve import start_gateway
from servepilot.gateway import Gateway
from tests.support.ray_cluster import node_of

PROMPT = {"model": "llama-3.1-8b", "prompt": "hello " * 20, "max_tokens": 48, "stream": True}
REPLICA_HEADER = "X-Servepilot-Replica"
# The load: this many clients, each sending its next request when the last one ended.
CLIENTS = 6
IN_FLIGHT_WITHIN_S = 10.0
"""How long the load may take to put two requests on the replica about to be lost."""
BACK_WITHIN_S = 90.0


@dataclass
class Outcome:
    replica: str | None = None
    kind: str = "pending"
    """complete | interrupted (an SSE error event ended it) | http_error | broken | hang"""
    detail: str = ""
    streamed: bool = False
    """Generated content had reached the client before the request ended."""


@dataclass(frozen=True)
class NodeLoss:
    """What one node loss did."""

    outcomes: list[Outcome]
    """The requests sent from before the loss until the load stopped."""
    lost_id: str
    said: list[str]
    """The watcher's lines (lost, serves again)."""
    recovery_s: float
    """From the node's loss to the replica's return into the gateway."""
    dead_s: float
    """From the node's loss until Ray marked it dead (its health checks missed)."""
    after: list[Outcome]
    """Requests sent once the replica was back (one per replica, three times)."""
    nodes: list[str]
    """The node of each replica at the end."""
    continued: int
    """Streams the gateway sent on to another replica (servepilot_stream_continuations_total)."""


async def stream_once(session: aiohttp.ClientSession, url: str) -> Outcome:
    """One streamed completion through the gateway, and its single outcome (never raises)."""
    outcome = Outcome()
    try:
        async with asyncio.timeout(30):
            async with session.post(f"{url}/v1/completions", json=PROMPT) as resp:
                outcome.replica = resp.headers.get(REPLICA_HEADER)
                body = await resp.read()
                if resp.status != 200:
                    outcome.kind, outcome.detail = "http_error", f"{resp.status} {body[:200]!r}"
                    return outcome
    except TimeoutError:
        outcome.kind = "hang"
        return outcome
    except aiohttp.ClientError as exc:
        outcome.kind, outcome.detail = "broken", repr(exc)
        return outcome
    events = [e.strip() for e in body.split(b"\n\n") if e.strip()]
    outcome.streamed = any(_has_content(e) for e in events)
    if events and events[-1] == b"data: [DONE]" and events.count(b"data: [DONE]") == 1:
        outcome.kind = "complete"
    elif events and events[-1].startswith(b'data: {"error"'):
        outcome.kind, outcome.detail = "interrupted", events[-1][:200].decode()
    else:
        outcome.kind, outcome.detail = "broken", repr(body[-200:])
    return outcome


def _continuations(metrics_text: str) -> int:
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(metrics_text)
            for sample in family.samples
            if sample.name == "servepilot_stream_continuations_total"
        )
    )


def _has_content(event: bytes) -> bool:
    """An SSE event that carries generated text."""
    if not event.startswith(b"data: {"):
        return False
    try:
        choices = json.loads(event[6:]).get("choices") or []
    except ValueError:
        return False
    return any(isinstance(c, dict) and c.get("text") for c in choices)


async def _until(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(0.05)
    return condition()


async def node_loss_under_load(
    cluster: Cluster,
    config: FleetConfig,
    run_dir: Path,
    fleet_name: str,
    before_s: float = 2.0,
    after_s: float | None = 2.0,
) -> NodeLoss:
    """Start `config`'s replicas and a gateway, load them, lose the node of a replica that is
    on neither the head nor the driver's node, and wait until that replica serves again;
    everything of ours is removed on the way out (the node stays lost). The load starts
    `before_s` before the loss and stops `after_s` after it (None: once the replica serves
    again)."""
    said: list[str] = []
    back_at: list[float] = []

    def step(line: str) -> None:
        if "serves again" in line:
            back_at.append(time.monotonic())
        said.append(line)

    replicas = RayReplicas(config, run_dir, fleet_name)
    backend = RayBackend(replicas, said.append, step)
    await backend.start(config.replicas.count)
    infos = await backend.wait_started(lambda info: None)
    watcher = backend.watcher
    members = contextlib.AsyncExitStack()

    async def follow(gateway: Gateway) -> None:
        await members.enter_async_context(following(backend, gateway.membership))

    served = await start_gateway(config.gateway, [], members=follow)
    try:
        # Neither the head's node (the GCS) nor the one whose raylet this driver talks to (of
        # several raylets on one address Ray gives the driver any): losing either would take
        # the driver, and with it every replica actor it owns, down too.
        spared = {cluster.head_node.node_id, ray.get_runtime_context().get_node_id()}
        answers = replicas.answers
        lost_id = [r for r in replicas.replica_ids if answers[r].node_id not in spared][-1]

        def is_back() -> bool:
            return watcher.restarts[lost_id] == 1 and watcher.states[lost_id] is ReplicaState.READY

        async with aiohttp.ClientSession() as session:
            load = _Load(session, served.url)
            await asyncio.sleep(before_s)
            # Lose the node while it streams: its replica holds two of the clients' requests
            # (a CI run once lost it between two of them, and no stream was cut).
            pool = served.gateway.pool
            await _until(lambda: pool.get(lost_id).in_flight >= 2, IN_FLIGHT_WITHIN_S)
            lost_at = time.monotonic()
            dead = asyncio.ensure_future(_marked_dead_after(replicas.answers[lost_id], lost_at))
            await _lose_node(cluster, replicas.answers[lost_id])
            if after_s is None:
                await _until(is_back, BACK_WITHIN_S)
            else:
                await asyncio.sleep(after_s)
            outcomes = await load.stop()
            if not await _until(is_back, BACK_WITHIN_S) or not back_at:
                raise AssertionError(f"not back in {BACK_WITHIN_S:g} s: {watcher.states}, {said}")
            after = [await stream_once(session, served.url) for _ in range(3 * len(infos))]
            async with session.get(f"{served.url}/metrics") as resp:
                continued = _continuations(await resp.text())
        nodes = [watcher.answers[r.replica_id].node_id for r in replicas.replicas]
        dead_s = await dead
        recovery_s = back_at[0] - lost_at
        return NodeLoss(outcomes, lost_id, said, recovery_s, dead_s, after, nodes, continued)
    finally:
        await members.aclose()
        await served.stop(5)
        await backend.stop_all()


class _Load:
    """CLIENTS clients, each sending its next request when its last one ended, until stopped."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self._outcomes: list[Outcome] = []
        self._stop = asyncio.Event()

        async def client() -> None:
            while not self._stop.is_set():
                self._outcomes.append(await stream_once(session, url))

        self._clients = [asyncio.ensure_future(client()) for _ in range(CLIENTS)]

    async def stop(self) -> list[Outcome]:
        """Let every request in flight end; the outcomes of all."""
        self._stop.set()
        await asyncio.gather(*self._clients)
        return self._outcomes


async def _lose_node(cluster: Cluster, answer: ActorReady) -> None:
    """A node that loses power: its server dies at once with the streams it serves (a removed
    raylet alone would let it drain them), then the node."""
    assert answer.info is not None
    os.kill(answer.info.pid, signal.SIGKILL)
    await asyncio.to_thread(cluster.remove_node, node_of(cluster, answer.node_id), False)


async def _marked_dead_after(answer: ActorReady, since: float) -> float:
    """Seconds from `since` until Ray's GCS lists the replica's node as dead (NaN: not within
    BACK_WITHIN_S)."""

    def until_dead() -> float:
        while time.monotonic() - since < BACK_WITHIN_S:
            if not any(n["NodeID"] == answer.node_id and n["Alive"] for n in ray.nodes()):
                return time.monotonic() - since
            time.sleep(0.2)
        return float("nan")

    return await asyncio.to_thread(until_dead)
