"""Ports for replicas on this machine: free now, and not handed to anyone else lately.

A replica binds its ports itself, seconds or minutes after they were picked (vLLM binds its
HTTP port once the model is loaded). A port the OS offered free can meanwhile be offered again
to another picker: to the same process (hence the `avoid` set of the ports it gave) or to
another one, as when a node's Ray actors each start a replica at once. So every pick is written
to a small book shared by all servepilot processes of this user on this machine (a JSON file
in the temporary folder, under a file lock), and a port stays out of later picks for
`HOLD_S`, longer than any replica takes to bind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import tempfile
import time
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

HOLD_S = 1800.0
"""How long a port handed out stays out of others' picks: a large model on a slow disk can
take many minutes to load before vLLM binds its HTTP port."""


class PortBook:
    """The ports handed out on this machine lately, and until when each is held."""

    def __init__(self, path: Path, hold_s: float = HOLD_S) -> None:
        self.path = path
        self.hold_s = hold_s

    @classmethod
    def default(cls) -> PortBook:
        return cls(Path(tempfile.gettempdir()) / f"servepilot-ports-{os.getuid()}.json")

    @contextlib.contextmanager
    def open(self, now_s: float | None = None) -> Iterator[dict[int, float]]:
        """The ports held at `now_s` (default now) and until when, locked against every
        other process until the block ends; what the block adds is written back."""
        now_s = time.time() if now_s is None else now_s
        try:
            handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 (`with` below)
        except OSError:  # no book (a read-only temporary folder): picks are as the OS gives
            yield {}
            return
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            handle.seek(0)
            held = {port: until for port, until in _read(handle.read()).items() if until > now_s}
            yield held
            handle.seek(0)
            handle.truncate()
            handle.write(json.dumps({str(port): until for port, until in held.items()}))

    def held(self, now_s: float | None = None) -> set[int]:
        with self.open(now_s) as held:
            return set(held)


def _read(text: str) -> dict[int, float]:
    """A damaged or foreign book is an empty one: it only ever narrows the picks."""
    try:
        document = json.loads(text) if text else {}
        return {int(port): float(until) for port, until in document.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now and nobody was given lately."""
    return free_ports(1, host)[0]


def free_ports(
    count: int,
    host: str = "127.0.0.1",
    *,
    avoid: Collection[int] = (),
    book: PortBook | None = None,
) -> list[int]:
    """`count` ports nothing listens on right now, all different, none of `avoid` (ports the
    caller handed out already) and none the machine's book holds; they go into the book.

    They are held open together while they are picked: one closed at once can come straight
    back from the OS, and a replica's KV event port once did come back as another replica's
    HTTP port."""
    book = PortBook.default() if book is None else book
    now_s = time.time()
    with book.open(now_s) as held:
        ports = _pick(count, host, {*avoid, *held})
        held.update(dict.fromkeys(ports, now_s + book.hold_s))
    return ports


def _pick(count: int, host: str, avoid: Collection[int]) -> list[int]:
    taken = set(avoid)
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        # Each pick holds its port open, so no port comes twice.
        while len(ports) < count:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
            if port not in taken:
                taken.add(port)
                ports.append(port)
            elif len(sockets) > _MAX_OPEN:
                # The OS keeps offering taken ports: let them go (those picked stay taken).
                _close(sockets)
                sockets = []
        return ports
    finally:
        _close(sockets)


_MAX_OPEN = 256
"""Sockets held open at once while picking: the descriptors one pick may take."""


def _close(sockets: Iterable[socket.socket]) -> None:
    for sock in sockets:
        sock.close()
