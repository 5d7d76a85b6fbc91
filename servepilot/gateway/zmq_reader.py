"""A ZMQ socket read on the event loop through its file descriptor, without pyzmq's asyncio
layer.

pyzmq's asyncio socket makes a future, a poll and several option reads for every message:
following one replica's KV events that way cost the gateway about 390 us of CPU a batch on
this 2-core machine, where a blocking receive cost 150 (`benchmarks/kv_feed_cost.py`). Here the
loop watches the socket's descriptor, and a wake-up takes every message waiting with plain
non-blocking receives.

ZMQ's descriptor is a signal that the socket's state may have changed, not that a message is
there: reading `EVENTS` consumes the signal (so the loop does not spin on it), and only
`EVENTS` says whether a message waits. Every wake-up therefore reads `EVENTS`, and `receive`
takes messages until `EVENTS` says none is left, so a message that came with the signal
already consumed is never stranded.
"""

from __future__ import annotations

import asyncio

import zmq


class LoopReader:
    """One socket's messages for one task on the running loop; `close` ends it (the owner's
    stop), after which the socket is closed."""

    def __init__(self, socket: zmq.Socket[bytes]) -> None:
        self._socket = socket
        self._loop = asyncio.get_running_loop()
        self._fd = int(socket.getsockopt(zmq.FD))
        self._waiter: asyncio.Future[None] | None = None
        self._loop.add_reader(self._fd, self._wake)

    def _wake(self) -> None:
        readable = self._events() & zmq.POLLIN
        waiter = self._waiter
        if readable and waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _events(self) -> int:
        return int(self._socket.getsockopt(zmq.EVENTS))

    def _timed_out(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self) -> list[list[bytes]]:
        """Every message waiting now, in order; none waits, none is returned."""
        messages: list[list[bytes]] = []
        while self._events() & zmq.POLLIN:
            messages.append(self._socket.recv_multipart(zmq.NOBLOCK))
        return messages

    async def receive(self, timeout_s: float) -> list[list[bytes]]:
        """The messages waiting, at least one; [] once `timeout_s` passed without any."""
        messages = self.take()
        if messages:
            return messages
        self._waiter = self._loop.create_future()
        timer = self._loop.call_later(timeout_s, self._timed_out)
        try:
            await self._waiter
        finally:
            timer.cancel()
            self._waiter = None
        return self.take()

    def close(self) -> None:
        self._loop.remove_reader(self._fd)
        self._socket.close(linger=0)
