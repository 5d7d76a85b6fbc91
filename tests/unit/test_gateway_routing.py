"""Routing policies end to end: which replica the gateway picks (X-Servepilot-Replica), the
policy counters it exports, and the admin API's capacity and group fields."""

from __future__ import annotations

from typing import Any

import aiohttp

from servepilot.routing import prefix_hashes, prompt_text
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    Scrape,
    call,
    chat,
    content_of,
    eventually,
    gateway_in_front_of,
    in_background,
    queued,
    reaches,
    run,
    scrape,
    until,
)

BLOCK = 256
SYSTEM_A = "You are a careful assistant. " * 70  # 2030 characters: > 4 blocks of 256
SYSTEM_B = "Answer in French, briefly please. " * 60  # 2040 characters


def stats(metrics: Scrape, policy: str) -> dict[str, float]:
    samples = metrics.labelled("servepilot_routing_stat")
    return {
        dict(labels)["stat"]: value
        for labels, value in samples.items()
        if dict(labels)["policy"] == policy
    }


def shared_prefix_chat(system: str, question: str) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
    }


def hashes_of(body: dict[str, Any]) -> tuple[int, ...]:
    return prefix_hashes(prompt_text(body, BLOCK * 64), BLOCK, 64)


async def two_families(client: aiohttp.ClientSession, url: str, rounds: int) -> dict[str, set[str]]:
    """Send `rounds` questions of each system prompt, alternating; the replicas each went to."""
    picked: dict[str, set[str]] = {"A": set(), "B": set()}
    for index in range(rounds):
        for family, system in (("A", SYSTEM_A), ("B", SYSTEM_B)):
            reply = await call(client, url, shared_prefix_chat(system, f"question {index}?"))
            assert reply.status == 200
            picked[family].add(reply.replica)
    return picked


def shared_blocks(system: str) -> int:
    """Prefix blocks of a `shared_prefix_chat`, checking that no question changes them."""
    hashes = hashes_of(shared_prefix_chat(system, "question 0?"))
    assert hashes_of(shared_prefix_chat(system, "question 9?")) == hashes
    assert len(hashes) > 4
    return len(hashes)


async def start(*upstreams: FakeUpstream) -> list[FakeUpstream]:
    return [await upstream.start() for upstream in upstreams]


async def prime_both_groups(
    client: aiohttp.ClientSession, url: str, long_prompt: dict[str, Any]
) -> None:
    """Send one long and one short prompt first.

    length_shard / hybrid may lend a group's replicas to the other while that group has seen
    no prompt of its own for a while (`routing.group_idle_s`, new and still settling); once
    both kinds have been seen, each group keeps to its own prompts.
    """
    assert (await call(client, url, long_prompt)).status == 200
    assert (await call(client, url, chat("hi"))).status == 200


# --- session ---------------------------------------------------------------------------------


def test_session_ids_stick_to_one_replica_and_sessions_spread() -> None:
    async def body() -> None:
        upstreams = await start(FakeUpstream("a"), FakeUpstream("b"), FakeUpstream("c"))
        async with (
            gateway_in_front_of(upstreams, policy="session") as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            sessions = [f"session-{i}" for i in range(9)]
            homes: dict[str, set[str]] = {s: set() for s in sessions}
            for _ in range(3):  # turns interleaved across sessions
                for session in sessions:
                    reply = await call(client, url, headers={"X-Session-Id": session})
                    assert reply.status == 200
                    homes[session].add(reply.replica)
            assert all(len(replicas) == 1 for replicas in homes.values()), homes
            assert len(set().union(*homes.values())) >= 2  # sessions are spread
            for _ in range(3):  # requests without a session are not counted
                assert (await call(client, url)).status == 200
            counters = stats(await scrape(client, url), "session")
            assert counters == {
                "sessions": 9,
                "session_hits": 18,
                "session_misses": 9,
                "session_rebinds": 0,
            }

            # The replica of session-0 leaves: the session moves, then sticks again.
            (old_home,) = homes["session-0"]
            await gw.pool.remove(old_home, timeout_s=1.0)
            moved = {
                (await call(client, url, headers={"X-Session-Id": "session-0"})).replica
                for _ in range(3)
            }
            assert len(moved) == 1 and old_home not in moved

    run(body())


# --- prefix affinity -------------------------------------------------------------------------


def test_prefix_affinity_keeps_a_shared_prefix_on_one_replica_and_estimates_hits() -> None:
    async def body() -> None:
        upstreams = await start(FakeUpstream("a"), FakeUpstream("b"), FakeUpstream("c"))
        async with (
            gateway_in_front_of(upstreams, policy="prefix_affinity") as (_, url),
            aiohttp.ClientSession() as client,
        ):
            picked = await two_families(client, url, rounds=10)
            assert len(picked["A"]) == 1 and len(picked["B"]) == 1, picked
            blocks_a, blocks_b = shared_blocks(SYSTEM_A), shared_blocks(SYSTEM_B)
            metrics = await scrape(client, url)
            counters = stats(metrics, "prefix_affinity")
            assert counters["prefix_blocks_total"] == 10 * (blocks_a + blocks_b)
            # Every request but the first of each family finds all its blocks.
            assert counters["prefix_blocks_matched"] == 9 * (blocks_a + blocks_b)
            assert metrics.value("servepilot_prefix_hit_rate_estimate") == 0.9

    run(body())


def test_prefix_affinity_spills_from_a_replica_loaded_above_the_bound() -> None:
    async def body() -> None:
        upstreams = await start(FakeUpstream("a"), FakeUpstream("b"), FakeUpstream("c"))
        for upstream in upstreams:
            upstream.hold_requests = True
        async with (
            gateway_in_front_of(upstreams, policy="prefix_affinity") as (gw, url),
            aiohttp.ClientSession() as client,
        ):

            def holders() -> dict[str, list[str]]:
                return {u.name: [content_of(b) for b in u.received] for u in upstreams}

            replies = []
            for index in range(3):
                replies.append(
                    in_background(client, url, shared_prefix_chat(SYSTEM_A, f"q{index}"))
                )
                await eventually(reaches(lambda: gw.pool.total_in_flight(), index + 1))
            await eventually(until(lambda: sum(u.holding for u in upstreams) == 3))
            # Two in flight on the favourite: its load 2 is over (1 + 0.25) x 2/3 + 1, so the
            # third request goes elsewhere; the first two stay together.
            homes = {name: got for name, got in holders().items() if got}
            assert sorted(homes.values()) == [["q0", "q1"], ["q2"]], homes
            for upstream in upstreams:
                upstream.release_all()
            assert [(await reply).status for reply in replies] == [200, 200, 200]

    run(body())


def test_hybrid_shards_by_length_and_keeps_prefixes_together_within_each_group() -> None:
    async def body() -> None:
        upstreams = await start(
            FakeUpstream("a", group="short"),
            FakeUpstream("b", group="short"),
            FakeUpstream("c", group="long"),
            FakeUpstream("d", group="long"),
        )
        long_system = SYSTEM_A * 3  # 6090 characters: 1522 tokens at 4 characters each
        routing = {"length_boundary_tokens": 1000}
        async with (
            gateway_in_front_of(upstreams, policy="hybrid", routing=routing) as (_, url),
            aiohttp.ClientSession() as client,
        ):
            primer = chat("z" * 4100)  # 1025 tokens: long, and a prefix of its own
            await prime_both_groups(client, url, primer)
            picked: dict[str, set[str]] = {"short": set(), "long": set()}
            for index in range(10):
                for family, system in (("short", SYSTEM_A), ("long", long_system)):
                    doc = shared_prefix_chat(system, f"question {index}?")
                    reply = await call(client, url, doc)
                    assert reply.status == 200
                    picked[family].add(reply.replica)
            assert len(picked["short"]) == 1 and picked["short"] <= {"a", "b"}, picked
            assert len(picked["long"]) == 1 and picked["long"] <= {"c", "d"}, picked
            metrics = await scrape(client, url)
            counters = stats(metrics, "hybrid")
            assert (counters["shard_short"], counters["shard_long"]) == (1 + 10, 1 + 10)
            assert counters["shard_compensated"] == 0
            blocks = shared_blocks(SYSTEM_A) + shared_blocks(long_system)
            primer_blocks = len(hashes_of(primer))  # looked up once, never matched
            assert primer_blocks == 16
            total = primer_blocks + 10 * blocks
            assert counters["prefix_blocks_total"] == total
            assert counters["prefix_blocks_matched"] == 9 * blocks
            hit_rate = metrics.value("servepilot_prefix_hit_rate_estimate")
            assert hit_rate == 9 * blocks / total and hit_rate > 0.8

    run(body())


# --- length sharding -------------------------------------------------------------------------


def test_length_shard_sends_prompts_over_the_boundary_to_the_long_group() -> None:
    async def body() -> None:
        upstreams = await start(FakeUpstream("s", group="short"), FakeUpstream("l", group="long"))
        routing = {"length_boundary_tokens": 100}  # 400 characters at 4 per token
        async with (
            gateway_in_front_of(upstreams, policy="length_shard", routing=routing) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await prime_both_groups(client, url, chat("x" * 1000))
            cases: list[tuple[str, dict[str, Any], str]] = [
                ("/v1/chat/completions", chat("x" * 399), "s"),
                ("/v1/chat/completions", chat("x" * 400), "l"),
                ("/v1/chat/completions", chat("x" * 5000), "l"),
                ("/v1/chat/completions", chat("short"), "s"),
                # The whole conversation counts: two messages of 200 make 100 tokens.
                (
                    "/v1/chat/completions",
                    {
                        "model": "m",
                        "messages": [
                            {"role": "user", "content": "y" * 200},
                            {"role": "assistant", "content": "z" * 200},
                        ],
                    },
                    "l",
                ),
                ("/v1/completions", {"model": "m", "prompt": "p" * 400}, "l"),
                ("/v1/completions", {"model": "m", "prompt": "p" * 10}, "s"),
            ]
            for path, doc, expected in cases:
                reply = await call(client, url, doc, path=path)
                assert (reply.status, reply.replica) == (200, expected), (path, doc)
            counters = stats(await scrape(client, url), "length_shard")
            assert (counters["shard_short"], counters["shard_long"]) == (1 + 3, 1 + 4)
            assert counters["shard_compensated"] == 0

            # Without a long replica, long prompts go to the short group (not compensation).
            await gw.pool.remove("l", timeout_s=1.0)
            reply = await call(client, url, chat("x" * 5000))
            assert (reply.status, reply.replica) == (200, "s")

    run(body())


# --- admin API: capacity and group -----------------------------------------------------------


def test_admin_add_takes_capacity_and_group_and_validates_them() -> None:
    async def body() -> None:
        upstreams = await start(FakeUpstream("x"), FakeUpstream("y"), FakeUpstream("z"))
        x, y, z = upstreams
        admission = {"replica_concurrency": 7}
        routing = {"length_boundary_tokens": 100}
        async with (
            gateway_in_front_of(
                [], policy="length_shard", admission=admission, routing=routing
            ) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            admin = "/admin/replicas"
            bad: list[dict[str, Any]] = [
                {"capacity": 0},
                {"capacity": -1},
                {"capacity": "2"},
                {"capacity": 1.5},
                {"capacity": True},
                {"group": "medium"},
                {"group": "Short"},
                {"group": 1},
            ]
            for extra in bad:
                reply = await call(client, url, {"url": x.url, **extra}, path=admin)
                error = reply.error(400)
                assert error["code"] == "invalid_value", extra
                assert next(iter(extra)) in error["message"], (extra, error)
            assert gw.pool.replicas() == []

            added = [
                await call(client, url, {"id": "x", "url": x.url}, path=admin),
                await call(
                    client,
                    url,
                    {"id": "y", "url": y.url, "capacity": 1, "group": "short"},
                    path=admin,
                ),
                await call(client, url, {"id": "z", "url": z.url, "group": "long"}, path=admin),
            ]
            assert [reply.status for reply in added] == [201, 201, 201]
            assert [(r.json()["capacity"], r.json()["group"]) for r in added] == [
                (7, None),
                (1, "short"),
                (7, "long"),
            ]
            listing = await call(client, url, path=admin, method="GET")
            assert {r["id"]: (r["capacity"], r["group"]) for r in listing.json()} == {
                "x": (7, None),
                "y": (1, "short"),
                "z": (7, "long"),
            }
            metrics = await scrape(client, url)
            capacities = {"x": 7.0, "y": 1.0, "z": 7.0}
            for rid, capacity in capacities.items():
                assert metrics.value("servepilot_replica_capacity", {"replica": rid}) == capacity

            # The group routes: long prompts never reach the short replica y...
            await prime_both_groups(client, url, chat("x" * 800))
            seen_by_y = len(y.received)
            for _ in range(3):
                reply = await call(client, url, chat("x" * 800))
                assert reply.replica in {"x", "z"}  # x was placed by the policy
            assert len(y.received) == seen_by_y
            # ...and the capacity bounds it: with y full, the next request waits for it.
            await gw.pool.remove("x", timeout_s=1.0)
            await gw.pool.remove("z", timeout_s=1.0)
            y.hold_requests = True
            base = len(y.received)
            first = in_background(client, url, chat("first"))
            await eventually(until(lambda: y.holding == 1))
            second = in_background(client, url, chat("second"))
            await eventually(queued(gw, 1))
            y.release_next()
            await eventually(until(lambda: y.holding == 1 and len(y.received) == base + 2))
            y.release_all()
            assert [(await first).replica, (await second).replica] == ["y", "y"]

    run(body())


def test_a_full_short_group_overflows_to_the_long_group_rather_than_queue() -> None:
    """Work-conserving by design: compensation (at most 10%) moves traffic while the home
    group has room; once it is full, a request takes a free slot in the other group rather
    than wait for one in its own."""

    async def body() -> None:
        short = await FakeUpstream("s", group="short", capacity=1).start()
        long_ = await FakeUpstream("l", group="long").start()
        async with (
            gateway_in_front_of([short, long_], policy="length_shard") as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await prime_both_groups(client, url, chat("x" * 40_000))
            received_before = len(long_.received)
            short.hold_requests = True
            tasks = [in_background(client, url, chat("blocker"))]
            await eventually(until(lambda: short.holding == 1))
            for index in range(10):
                tasks.append(in_background(client, url, chat(f"short {index}")))
                await eventually(
                    reaches(
                        lambda: len(long_.received) - received_before + len(gw.dispatcher.queue),
                        index + 1,
                    )
                )
            try:
                assert len(long_.received) - received_before == 10
                assert len(gw.dispatcher.queue) == 0
            finally:
                short.release_all()
                assert [(await task).status for task in tasks] == [200] * 11

    run(body())
