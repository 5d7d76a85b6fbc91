"""vLLM's other OpenAI-compatible routes through the gateway (gateway/routes.py): the same
routing, admission and metrics as chat; a replica without the route is the gateway's 404
naming the route and the model; a multipart upload reaches the replica byte for byte."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from servepilot.gateway import Gateway
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import (
    FakeClock,
    as_class,
    call,
    eventually,
    gateway_in_front_of,
    in_background,
    queued,
    run,
    scrape,
    until,
)
from tests.unit.test_gateway_degradation import SUSTAIN_S, saturated_gateway_settings

POOLING_ROUTES = ["/v1/embeddings", "/v1/score", "/v1/rerank", "/pooling"]
BOUNDARY = "b0undary"


def _upload(model: str | None, audio: bytes) -> bytes:
    """A transcription upload as the openai client writes it (multipart/form-data)."""
    parts = [] if model is None else [(b'name="model"', model.encode())]
    parts.append((b'name="file"; filename="a.wav"\r\nContent-Type: audio/wav', audio))
    body = b"".join(
        b"--%b\r\nContent-Disposition: form-data; %b\r\n\r\n%b\r\n" % (BOUNDARY.encode(), h, v)
        for h, v in parts
    )
    return body + b"--%b--\r\n" % BOUNDARY.encode()


MULTIPART = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


async def _models_known(gateway: Gateway, models: set[str]) -> None:
    """Until the gateway has read each replica's /v1/models: the read at a replica's add can
    time out on a busy machine (a fresh clone's run), and a replica whose models are not yet
    known may be sent any model."""
    await eventually(until(lambda: gateway.pool.known_models == models))


@pytest.mark.parametrize("path", ["/v1/responses", *POOLING_ROUTES])
def test_a_route_the_replica_has_is_relayed_routed_and_counted(path: str) -> None:
    async def body() -> None:
        ups = [FakeUpstream("a", models=("m",)), FakeUpstream("b", models=("e",))]
        for up in ups:
            up.extra_routes = (path,)
            await up.start()
        async with gateway_in_front_of(ups) as (gw, url), aiohttp.ClientSession() as client:
            await _models_known(gw, {"m", "e"})
            sent = {"model": "e", "input": ["one", "two"]}
            reply = await call(client, url, sent, path=path)
            assert (reply.status, reply.replica) == (200, "b")
            assert reply.json()["object"] == "chat.completion"  # the replica's answer, relayed
            metrics = await scrape(client, url)
        assert ups[1].received == [sent] and not ups[0].received
        assert metrics.value("servepilot_requests_total", {"route": path, "code": "200"}) == 1

    run(body())


def test_a_pooling_route_waits_for_a_replica_slot_like_chat() -> None:
    async def body() -> None:
        up = FakeUpstream("a", capacity=1)
        up.extra_routes = ("/v1/embeddings",)
        await up.start()
        up.hold_requests = True
        async with (
            gateway_in_front_of([up]) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            embed = {"model": "m", "input": "hi"}
            first = in_background(client, url, embed, path="/v1/embeddings")
            await eventually(until(lambda: up.holding == 1))
            second = in_background(client, url, embed, path="/v1/embeddings")
            await eventually(queued(gw, 1))  # the replica's budget is 1: the second waits
            up.release_all()
            replies = await asyncio.gather(first, second)
        assert [r.status for r in replies] == [200, 200] and up.max_in_flight == 1

    run(body())


@pytest.mark.parametrize("path", [*POOLING_ROUTES, "/v1/audio/translations"])
def test_a_route_the_replicas_lack_is_a_404_naming_the_route_and_the_model(path: str) -> None:
    async def body() -> None:
        up = await FakeUpstream("a", models=("gen",)).start()
        async with gateway_in_front_of([up]) as (_, url), aiohttp.ClientSession() as client:
            if path.startswith("/v1/audio/"):
                reply = await call(client, url, path=path, raw=_upload("gen", b"RIFF"),
                                   headers=MULTIPART)  # fmt: skip
            else:
                reply = await call(client, url, {"model": "gen", "input": "hi"}, path=path)
            error = reply.error(404)
            metrics = await scrape(client, url)
        assert error["code"] == "not_found" and error["type"] == "invalid_request_error"
        assert error["message"].startswith(
            f"the model 'gen' does not serve POST {path}: replica a answered 404 (404: Not Found); "
            f"vLLM serves {path} for "
        )
        assert metrics.value("servepilot_requests_total", {"route": path, "code": "404"}) == 1

    run(body())


def test_a_multipart_upload_reaches_the_replica_of_its_model_unchanged() -> None:
    async def body() -> None:
        ups = [FakeUpstream("a", models=("gen",)), FakeUpstream("b", models=("whisper",))]
        for up in ups:
            await up.start()
        audio = bytes(range(256)) * 2048  # every byte value, CRLFs and dashes included
        upload = _upload("whisper", audio)
        path = "/v1/audio/transcriptions"
        async with gateway_in_front_of(ups) as (gw, url), aiohttp.ClientSession() as client:
            await _models_known(gw, {"gen", "whisper"})
            reply = await call(client, url, path=path, raw=upload, headers=MULTIPART)
            assert (reply.status, reply.replica) == (200, "b")
            assert reply.json() == {"text": "heard by b"}
            several = await call(client, url, path=path, raw=_upload(None, b"x"), headers=MULTIPART)
            assert several.error(400)["code"] == "missing_field"
        assert ups[1].uploads == [(MULTIPART["Content-Type"], upload)] and not ups[0].uploads

    run(body())


def test_responses_are_capped_by_max_output_tokens_under_degradation() -> None:
    """At the degraded level that caps answers, a Responses request's bound is its
    `max_output_tokens` (set when absent); a pooling request has none to cap."""

    async def body() -> None:
        clock = FakeClock()
        upstream, settings = await saturated_gateway_settings()  # degraded_max_tokens 7
        upstream.extra_routes = ("/v1/responses", "/v1/embeddings")
        await upstream.stop()
        await upstream.start()  # again, with the routes
        async with (
            gateway_in_front_of([upstream], clock=clock, **settings) as (gw, url),
            aiohttp.ClientSession() as client,
        ):
            await clock.wait_read()  # first tick: saturation starts now
            for _ in range(2):
                clock.advance(1.5 * SUSTAIN_S)
                await clock.wait_read()
            assert gw.dispatcher.soft_limit.level == 2
            for sent in ({"input": "hi"}, {"input": "hi", "max_output_tokens": 1000},
                         {"input": "hi", "max_output_tokens": 3}):  # fmt: skip
                reply = await call(client, url, {"model": "m", **sent}, path="/v1/responses",
                                   headers=as_class(1))  # fmt: skip
                assert reply.status == 200
            embed = await call(client, url, {"model": "m", "input": "hi"}, path="/v1/embeddings",
                               headers=as_class(1))  # fmt: skip
            assert embed.status == 200
        assert [r.get("max_output_tokens") for r in upstream.received[:3]] == [7, 7, 3]
        assert upstream.received[3] == {"model": "m", "input": "hi"}
        assert all("max_tokens" not in r for r in upstream.received)

    run(body())
