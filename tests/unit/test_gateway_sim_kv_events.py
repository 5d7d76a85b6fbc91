"""The gateway in front of simulated replicas keeps an exact index of their prefix caches, as
it does for vLLM's: from the ports `up` gives a replica, or from what the replica says in
GET /kv_event_sources. `up --engine sim` starts its replicas with `--kv-events-config`."""

from __future__ import annotations

from typing import Any

import aiohttp

from servepilot.core.config import parse_config
from servepilot.engine.args import KvEventsPorts
from servepilot.engine.simserver.args import sim_model
from servepilot.engine.simserver.config import build_setup, parse_args
from servepilot.fleet.local import LocalBackend, LocalReplicas
from servepilot.fleet.membership import MembershipFeed
from servepilot.fleet.replica_launch import replica_command, replica_ports
from servepilot.fleet.serve import kv_index_settings
from servepilot.gateway import Gateway
from servepilot.gateway.kv_events import KvEventFeeds
from servepilot.gateway.tokens import PromptBlocks, PromptTokenizer
from tests.unit.gateway_support import gateway_in_front_of, run, scrape
from tests.unit.kv_events_support import eventually
from tests.unit.sim_kv_support import BS, HASHING, chat, sim_args, tokenizer_folder
from tests.unit.sim_support import ThreadedSim

PREFIX_POLICY: dict[str, Any] = {"policy": "prefix_affinity"}


def _ports(sim: ThreadedSim) -> tuple[int, int]:
    """Where a replica started on `tcp://*:0` publishes: the ports it bound."""
    assert sim.publisher is not None
    bound = sim.publisher.config
    assert bound.replay_endpoint is not None
    return int(bound.endpoint.rpartition(":")[2]), int(bound.replay_endpoint.rpartition(":")[2])


async def _replicas(client: aiohttp.ClientSession, url: str) -> dict[str, dict[str, Any]]:
    async with client.get(f"{url}/admin/replicas") as resp:
        return {r["id"]: r for r in await resp.json()}


def _feeds(gateway: Gateway) -> KvEventFeeds:
    assert gateway.kv_feeds is not None
    return gateway.kv_feeds


def test_the_gateway_reports_simulated_replicas_exact() -> None:
    """ "a" joined with its ports (as `up` joins it), "b" learnt from its /kv_event_sources,
    "c" started without events: guessed, and the gateway says why."""
    with (
        ThreadedSim(sim_args()) as a,
        ThreadedSim(sim_args()) as b,
        ThreadedSim(sim_args(events=False)) as c,
    ):

        async def body() -> None:
            kv_index = {"tokenizer": str(tokenizer_folder()), "block_size": BS}
            async with (
                gateway_in_front_of([], kv_index=kv_index, **PREFIX_POLICY) as (gw, url),
                aiohttp.ClientSession() as client,
            ):
                await gw.membership.join("a", a.url, kv_events=_ports(a))
                await gw.membership.join("b", b.url)
                await gw.membership.join("c", c.url)
                index = _feeds(gw).index
                await eventually(lambda: set(index.exact_replicas()) == {"a", "b"})
                # "c" is guessed from the start ("has not said where..."): wait for its answer.
                feeds = _feeds(gw)
                await eventually(
                    lambda: "publishes no" in feeds.describe("c").get("prefix_index_why", "")
                )
                listed = await _replicas(client, url)
                assert [listed[r]["prefix_index"] for r in "abc"] == ["exact", "exact", "guessed"]
                assert listed["a"]["kv_events"] == f"tcp://127.0.0.1:{_ports(a)[0]}"
                assert listed["c"]["prefix_index_why"] == (
                    "c publishes no KV events (started without --kv-events-config)"
                )
                await _served_where_cached(gw, client, url)

        run(body(), timeout_s=60)


async def _served_where_cached(gw: Gateway, client: aiohttp.ClientSession, url: str) -> None:
    """A prompt's blocks appear in the index of the replica that served it, and the same
    prompt goes back there."""
    index = _feeds(gw).index
    served = ""
    for n in range(6):  # until one lands on a replica whose events flow
        body = chat(f"Question number {n}: which river flows through Vienna?")
        async with client.post(f"{url}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            served = resp.headers["X-Servepilot-Replica"]
        if served in ("a", "b"):
            break
    assert served in ("a", "b")
    hashes = PromptBlocks(PromptTokenizer(tokenizer_folder()), HASHING).keys(body)
    assert hashes is not None and hashes.block_hashes
    whole = len(hashes.block_hashes) * BS
    await eventually(lambda: index.cached_prefix_tokens(served, hashes.block_hashes) == whole)
    metrics = await scrape(client, url)
    assert metrics.value("servepilot_prefix_index_exact", {"replica": served}) == 1.0
    assert metrics.value("servepilot_prefix_index_blocks", {"replica": served}) > 0
    async with client.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.headers["X-Servepilot-Replica"] == served


def test_up_starts_simulated_replicas_with_the_publisher() -> None:
    config = parse_config({"engine": {"kind": "sim", "sim_step_ms": 5}}, origin="test")
    model = sim_model(config.model)
    port, ports = replica_ports(config, avoid={9001})
    assert ports is not None
    assert len({port, ports.publish, ports.replay, 9001}) == 4  # all different
    argv = replica_command(config, model, "127.0.0.1", port, (), ports).argv
    setup = build_setup(parse_args(list(argv[3:]))[0])
    assert setup.kv_events.publishes
    assert (setup.kv_events.endpoint, setup.kv_events.replay_endpoint) == (
        f"tcp://*:{ports.publish}", f"tcp://*:{ports.replay}",
    )  # fmt: skip
    off = parse_config({"engine": {"kind": "sim", "kv_events": False}}, origin="test")
    assert replica_ports(off)[1] is None
    assert "--kv-events-config" not in replica_command(off, model, "127.0.0.1", 1, ()).argv


def test_a_fleet_of_simulated_replicas_is_followed_exactly(tmp_path: Any) -> None:
    """`up`'s path with real replica processes: the local backend starts one, its watch
    joins it to the gateway with its KV event ports, the gateway keys prompts with the
    tokenizer the replica counts with."""
    folder = tokenizer_folder()
    config = parse_config(
        {"engine": {"kind": "sim", "sim_step_ms": 5, "block_size": BS}}, origin="test"
    )
    model = sim_model(config.model)
    assert model.tokenizer == folder

    async def body() -> None:
        backend = LocalBackend(LocalReplicas(config, model, tmp_path), lambda info: 8)
        settings = kv_index_settings(config, str(model.tokenizer))
        gateway = Gateway(settings.model_copy(update={"port": 0, **PREFIX_POLICY}))
        feed = MembershipFeed(backend.watch(), gateway.membership)
        try:
            await backend.start(1)
            (info,) = await backend.wait_started(lambda info: None)
            assert isinstance(info.kv_events, KvEventsPorts)
            port = await gateway.start("127.0.0.1", 0)
            await feed.start()
            await eventually(lambda: _feeds(gateway).index.is_exact("r0"))
            url = f"http://127.0.0.1:{port}"
            async with aiohttp.ClientSession() as client:
                body = chat("Which sea lies east of Italy?")
                for _ in range(2):
                    async with client.post(f"{url}/v1/chat/completions", json=body) as resp:
                        assert resp.status == 200, await resp.text()
                await eventually(lambda: _feeds(gateway).index.blocks_held("r0") > 0)
                listed = await _replicas(client, url)
            assert listed["r0"]["kv_events"] == f"tcp://127.0.0.1:{info.kv_events.publish}"
            assert listed["r0"]["prefix_index"] == "exact"
        finally:
            await feed.stop()
            await gateway.stop(drain_timeout_s=1.0)
            await backend.stop_all()

    run(body(), timeout_s=120)
