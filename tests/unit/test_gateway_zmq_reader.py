"""LoopReader: a ZMQ socket's messages taken on the event loop, through real sockets on
loopback."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import zmq

from servepilot.gateway.zmq_reader import LoopReader

Pair = tuple[zmq.Socket[bytes], zmq.Socket[bytes]]


@pytest.fixture
def pair() -> Iterator[Pair]:
    context = zmq.Context()
    pub: zmq.Socket[bytes] = context.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub: zmq.Socket[bytes] = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(f"tcp://127.0.0.1:{port}")
    yield pub, sub
    pub.close(linger=0)
    sub.close(linger=0)
    context.term()


def _connected(pub: zmq.Socket[bytes], sub: zmq.Socket[bytes]) -> None:
    """PUB drops what it sends before the subscription reaches it: send until one arrives."""
    for _ in range(200):
        pub.send_multipart([b"hello"])
        if sub.poll(20):
            while sub.poll(50):
                sub.recv_multipart()
            return
    raise AssertionError("the subscriber never connected")


def test_messages_come_in_order_and_a_burst_in_one_wake(pair: Pair) -> None:
    async def body() -> None:
        pub, sub = pair
        _connected(pub, sub)
        reader = LoopReader(sub)
        try:
            for i in range(50):
                pub.send_multipart([b"t", i.to_bytes(2, "big")])
            got: list[int] = []
            wakes = 0
            while len(got) < 50:
                messages = await reader.receive(2.0)
                assert messages, "timed out with messages sent"
                wakes += 1
                got += [int.from_bytes(m[1], "big") for m in messages]
            assert got == list(range(50))
            assert wakes < 50  # taken together, not one wake-up a message
        finally:
            reader.close()

    asyncio.run(body())


def test_a_message_sent_while_waiting_wakes_the_reader(pair: Pair) -> None:
    async def body() -> None:
        pub, sub = pair
        _connected(pub, sub)
        reader = LoopReader(sub)
        try:
            loop = asyncio.get_running_loop()
            loop.call_later(0.1, pub.send_multipart, [b"late"])
            started = time.monotonic()
            messages = await reader.receive(5.0)
            assert messages == [[b"late"]]
            assert time.monotonic() - started < 2.0
        finally:
            reader.close()

    asyncio.run(body())


def test_nothing_sent_returns_empty_after_the_timeout(pair: Pair) -> None:
    async def body() -> None:
        pub, sub = pair
        _connected(pub, sub)
        reader = LoopReader(sub)
        try:
            started = time.monotonic()
            assert await reader.receive(0.2) == []
            assert 0.15 <= time.monotonic() - started < 2.0
            # and a message after the timeout is still delivered
            pub.send_multipart([b"after"])
            assert await reader.receive(2.0) == [[b"after"]]
        finally:
            reader.close()

    asyncio.run(body())


def test_close_stops_watching_and_closes_the_socket(pair: Pair) -> None:
    async def body() -> None:
        _pub, sub = pair
        reader = LoopReader(sub)
        fd = int(sub.getsockopt(zmq.FD))
        reader.close()
        assert sub.closed
        assert not asyncio.get_running_loop().remove_reader(fd)  # already removed

    asyncio.run(body())
