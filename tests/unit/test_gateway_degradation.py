"""Admission under sustained saturation: the soft limit sheds batch requests, then caps
max_tokens, and steps back down once saturation is over; time runs on an injected fake clock.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    URGENT_KEY,
    FakeClock,
    as_class,
    assert_all_counters_zero,
    call,
    chat,
    content_of,
    eventually,
    gateway_in_front_of,
    idle,
    run,
    scrape,
    until,
    vllm_metrics,
)

SUSTAIN_S = 5.0


async def saturated_gateway_settings() -> tuple[FakeUpstream, dict[str, Any]]:
    upstream = FakeUpstream("a")
    upstream.metrics_text = vllm_metrics(kv_cache_usage=0.99)
    await upstream.start()
    settings: dict[str, Any] = {
        # 0.99 is saturated for the soft limit but not "full" for admission.
        "admission": {"kv_full_usage": 1.0},
        "protection": {"soft_limit_sustain_s": SUSTAIN_S, "degraded_max_tokens": 7},
        "retry_after_s": 5,
        "auth": URGENT_KEY,
    }
    return upstream, settings


def test_sustained_saturation_sheds_batch_then_caps_max_tokens() -> None:
    async def body() -> None:
        clock = FakeClock()
        upstream, settings = await saturated_gateway_settings()
        async with (
            gateway_in_front_of([upstream], clock=clock, **settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            level = gw.dispatcher.soft_limit
            await clock.wait_read()  # first tick: saturation starts now
            assert level.level == 0
            assert (await call(client, url, chat("p2 ok"), headers=as_class(2))).status == 200

            clock.advance(1.5 * SUSTAIN_S)
            await eventually(idle(gw))
            await clock.wait_read()
            assert level.level == 1
            refused = await call(client, url, chat("p2 shed"), headers=as_class(2))
            assert refused.error(429)["code"] == "degraded"
            assert refused.headers["Retry-After"] == "5"
            uncapped = chat("p1 uncapped", max_tokens=1000)
            assert (await call(client, url, uncapped, headers=as_class(1))).status == 200
            assert upstream.received[-1] == uncapped
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_degradation_level") == 1
            assert metrics.value("servepilot_shed_total", {"reason": "degraded", "class": "2"}) == 1
            assert metrics.value("servepilot_degradation_steps_total", {"level": "1"}) == 1

            clock.advance(SUSTAIN_S)
            await eventually(idle(gw))
            await clock.wait_read()
            assert level.level == 2
            sent: list[tuple[int, dict[str, Any]]] = [
                (1, chat("p1 big", max_tokens=1000)),
                (1, chat("p1 absent")),
                (1, chat("p1 small", max_tokens=3)),
                (1, chat("p1 completion", max_tokens=3, max_completion_tokens=500)),
                (1, chat("p1 stream", max_tokens=1000, stream=True)),
                (0, chat("p0 big", max_tokens=1000)),
            ]
            for cls_, request in sent:
                assert (await call(client, url, request, headers=as_class(cls_))).status == 200
            seen = {content_of(b): b for b in upstream.received}
            assert seen["p1 big"]["max_tokens"] == 7
            assert seen["p1 absent"]["max_tokens"] == 7
            assert seen["p1 small"]["max_tokens"] == 3
            assert (
                seen["p1 completion"]["max_tokens"],
                seen["p1 completion"]["max_completion_tokens"],
            ) == (3, 7)
            assert seen["p1 stream"]["max_tokens"] == 7 and seen["p1 stream"]["stream"] is True
            assert seen["p0 big"]["max_tokens"] == 1000  # interactive requests are not capped
            completion = {"model": "m", "prompt": "once", "max_tokens": 99}
            assert (
                await call(client, url, completion, path="/v1/completions", headers=as_class(1))
            ).status == 200
            assert upstream.received[-1]["max_tokens"] == 7
            refused = await call(client, url, chat("p2 shed again"), headers=as_class(2))
            assert refused.error(429)["code"] == "degraded"
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_degradation_level") == 2
            assert metrics.value("servepilot_shed_total", {"reason": "degraded", "class": "2"}) == 2
            assert metrics.value("servepilot_degradation_steps_total", {"level": "2"}) == 1
            await assert_all_counters_zero(gw, client, url)

    run(body())


def test_degradation_steps_back_down_once_saturation_is_over() -> None:
    async def body() -> None:
        clock = FakeClock()
        upstream, settings = await saturated_gateway_settings()
        async with (
            gateway_in_front_of([upstream], clock=clock, **settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            level = gw.dispatcher.soft_limit
            await clock.wait_read()
            clock.advance(2 * SUSTAIN_S)  # two sustain periods at once: two steps up
            await clock.wait_read()
            assert level.level == 2
            upstream.metrics_text = vllm_metrics(kv_cache_usage=0.1)
            await eventually(until(lambda: gw.pool.get("a").kv_cache_usage == 0.1))
            await clock.wait_read()  # calm starts now
            clock.advance(SUSTAIN_S)  # exactly one sustain period of calm: one step down
            await clock.wait_read()
            assert level.level == 1
            assert (await call(client, url, chat("p1"), headers=as_class(1))).status == 200
            assert "max_tokens" not in upstream.received[-1]  # no longer capped
            clock.advance(SUSTAIN_S)
            await eventually(idle(gw))
            await clock.wait_read()
            assert level.level == 0
            assert (await call(client, url, chat("p2"), headers=as_class(2))).status == 200
            metrics = await scrape(client, url)
            assert metrics.value("servepilot_degradation_level") == 0
            steps = metrics.labelled("servepilot_degradation_steps_total")
            assert {dict(labels)["level"]: count for labels, count in steps.items()} == {
                "1": 2,
                "2": 1,
                "0": 1,
            }

    run(body())
