"""Tenants at the gateway: API keys carry them into the queue's fair shares, and /metrics counts
admission per tenant under bounded labels. One replica slot, requests held by the upstream
until the test releases them, so the order of service is exact."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from servepilot.gateway.tenant_metrics import OTHER, TenantMetrics
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    Reply,
    assert_all_counters_zero,
    chat,
    content_of,
    eventually,
    gateway_in_front_of,
    in_background,
    reaches,
    run,
    scrape,
)

# Two keys of one team share its tenant; the third key, without one, is its own tenant "b".
KEYS: dict[str, Any] = {
    "keys": [
        {"name": "a-web", "key": "sk-a1", "tenant": "team-a"},
        {"name": "a-cron", "key": "sk-a2", "tenant": "team-a"},
        {"name": "b", "key": "sk-b"},
    ]
}
SENT = [("a1", "sk-a1"), ("a2", "sk-a1"), ("a3", "sk-a1"), ("a4", "sk-a1"), ("b1", "sk-b"),
        ("b2", "sk-b"), ("a5", "sk-a2")]  # fmt: skip


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize(
    ("fair", "served"),
    [
        # a1 takes the slot; then team-a's and b's turns alternate, a5 counting as team-a's.
        (True, ["a1", "a2", "b1", "a3", "b2", "a4", "a5"]),
        (False, ["a1", "a2", "a3", "a4", "b1", "b2", "a5"]),
    ],
)
def test_keys_tenants_take_turns_for_the_slot_and_metrics_count_them(
    fair: bool, served: list[str]
) -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with (
            gateway_in_front_of([upstream], auth=KEYS, admission={"fair_shares": fair}) as (
                gw,
                url,
            ),
            aiohttp.ClientSession() as client,
        ):
            replies: list[asyncio.Task[Reply]] = []
            for index, (name, key) in enumerate(SENT):
                replies.append(in_background(client, url, chat(name), headers=bearer(key)))
                await eventually(
                    reaches(lambda: upstream.holding + len(gw.dispatcher.queue), index + 1)
                )
            metrics = await scrape(client, url)
            depth = "servepilot_tenant_queue_depth"
            assert metrics.value(depth, {"tenant": "team-a"}) == 4
            assert metrics.value(depth, {"tenant": "b"}) == 2
            assert metrics.value(depth, {"tenant": OTHER}) == 0
            for count in range(2, len(SENT) + 1):
                upstream.release_next()
                await eventually(reaches(lambda: len(upstream.received), count))
            upstream.release_all()
            assert [(await reply).status for reply in replies] == [200] * len(SENT)
            assert [content_of(b) for b in upstream.received] == served
            metrics = await scrape(client, url)
            counts = {
                (name, tenant): metrics.value(f"servepilot_tenant_{name}_total", {"tenant": tenant})
                for name in ("admitted", "queued", "rejected")
                for tenant in ("team-a", "b", OTHER)
            }
            assert counts == {
                ("admitted", "team-a"): 5, ("admitted", "b"): 2, ("admitted", OTHER): 0,
                ("queued", "team-a"): 4, ("queued", "b"): 2, ("queued", OTHER): 0,
                ("rejected", "team-a"): 0, ("rejected", "b"): 0, ("rejected", OTHER): 0,
            }  # fmt: skip
            waits = "servepilot_tenant_queue_wait_seconds_count"
            assert metrics.value(waits, {"tenant": "team-a"}) == 4
            assert metrics.value(waits, {"tenant": "b"}) == 2
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_refusals_count_for_the_tenant_and_labels_stay_bounded() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        admission = {"max_queued": 0, "tenant_weights": {"gold": 2.0}}
        async with (
            gateway_in_front_of([upstream], auth=KEYS, admission=admission) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            held = in_background(client, url, chat("a1"), headers=bearer("sk-a1"))
            await eventually(reaches(lambda: upstream.holding, 1))
            refused = in_background(client, url, chat("b1"), headers=bearer("sk-b"))
            assert (await refused).status == 429
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_tenant_rejected_total", {"tenant": "b"}) == 1
            assert metrics.value("servepilot_tenant_admitted_total", {"tenant": "team-a"}) == 1
            tenants = {
                dict(labels)["tenant"]
                for labels in metrics.labelled("servepilot_tenant_admitted_total")
            }
            # The configured tenants, the batch API's, "other"; never a key's name or secret.
            assert tenants == {"team-a", "b", "gold", "batch", OTHER}
            upstream.release_all()
            assert (await held).status == 200
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_a_tenant_fleet_yaml_does_not_name_is_counted_as_other() -> None:
    counters = TenantMetrics(["a"])
    for tenant in ("a", "zz", "yy"):
        counters.count_admitted(tenant)
    counters.count_rejected("zz")
    assert counters.admitted == {"a": 1, OTHER: 2}
    assert counters.rejected == {"a": 0, OTHER: 1}


def test_a_full_queue_makes_room_for_a_tenant_under_its_share() -> None:
    async def body() -> None:
        upstream = await FakeUpstream("a", capacity=1).start()
        upstream.hold_requests = True
        async with (
            gateway_in_front_of([upstream], auth=KEYS, admission={"max_queued": 2}) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            replies: dict[str, asyncio.Task[Reply]] = {}
            # a1 takes the slot, a2 and a3 fill the queue, a4 is refused: team-a holds it all.
            for index, name in enumerate(["a1", "a2", "a3", "a4"]):
                replies[name] = in_background(client, url, chat(name), headers=bearer("sk-a1"))
                if index < 3:
                    await eventually(
                        reaches(lambda: upstream.holding + len(gw.dispatcher.queue), index + 1)
                    )
            assert (await replies["a4"]).error(429)["code"] == "queue_full"
            # b has no place of its own: team-a's newest (a3) leaves for it.
            replies["b1"] = in_background(client, url, chat("b1"), headers=bearer("sk-b"))
            pushed = await replies["a3"]
            assert pushed.error(429)["code"] == "queue_full"
            assert "retry-after" in pushed.headers
            upstream.release_all()
            assert [(await replies[n]).status for n in ("a1", "a2", "b1")] == [200] * 3
            assert [content_of(b) for b in upstream.received] == ["a1", "a2", "b1"]
            metrics = await scrape(client, url)
            rejected = "servepilot_tenant_rejected_total"
            assert metrics.value(rejected, {"tenant": "team-a"}) == 2
            assert metrics.value(rejected, {"tenant": "b"}) == 0
            await assert_all_counters_zero(gw, client, url)

    run(body())
