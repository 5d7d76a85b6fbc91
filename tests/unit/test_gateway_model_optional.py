"""`model` is optional, as in vLLM 0.32: the fleet's only model serves a request without one;
with several models it is the client's mistake, a 400 that names them."""

from __future__ import annotations

import aiohttp

from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import CHAT, HEADER, error_of, gateway_in_front_of, run


def test_a_request_without_model_goes_to_the_fleets_only_model() -> None:
    """As vLLM 0.32 has it: no `model`, the one model serves it (the body is forwarded as
    it came); a replica's other served names of that model are the same model."""

    async def body() -> None:
        one = await FakeUpstream("a").start()
        aliased = await FakeUpstream("b", models=("m", "m-alias")).start()
        for upstreams, replicas in (([one], {"a"}), ([aliased], {"b"})):
            async with (
                gateway_in_front_of(upstreams) as (_, url),
                aiohttp.ClientSession() as client,
            ):
                bare = {"messages": CHAT["messages"]}
                async with client.post(f"{url}/v1/chat/completions", json=bare) as resp:
                    assert resp.status == 200 and resp.headers[HEADER] in replicas
                prompt = {"prompt": "hi", "max_tokens": 2}
                async with client.post(f"{url}/v1/completions", json=prompt) as resp:
                    assert resp.status == 200
            assert [sorted(r) for r in upstreams[0].received] == [
                ["messages"],
                ["max_tokens", "prompt"],
            ]
        await one.stop()
        await aliased.stop()

    run(body())


def test_a_request_without_model_to_several_models_is_a_400_naming_them() -> None:
    async def body() -> None:
        ups = [await FakeUpstream("a", models=("m",)).start(),
               await FakeUpstream("b", models=("n", "m")).start()]  # fmt: skip
        async with gateway_in_front_of(ups) as (_, url), aiohttp.ClientSession() as client:
            bare = {"messages": CHAT["messages"]}
            async with client.post(f"{url}/v1/chat/completions", json=bare) as resp:
                error = await error_of(resp, 400)
        assert error["code"] == "missing_field"
        assert error["message"] == (
            "the request body has no `model` and this gateway serves several; name one of: m, n"
        )
        assert all(not up.received for up in ups)
        for up in ups:
            await up.stop()

    run(body())
