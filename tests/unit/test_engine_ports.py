"""free_ports: ports picked together are all different, avoid those handed out already, and
are written to the machine's book, so that another process does not pick them meanwhile."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from servepilot.core.config import parse_config
from servepilot.engine.ports import PortBook, free_port, free_ports
from servepilot.fleet.replica_launch import replica_ports


def test_ports_picked_together_are_all_different_and_free(tmp_path: Path) -> None:
    ports = free_ports(40, book=PortBook(tmp_path / "book.json"))
    assert len(set(ports)) == 40
    for port in ports:  # each can be bound now: nothing listens there
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_ports_handed_out_already_are_not_given_again(tmp_path: Path) -> None:
    book = PortBook(tmp_path / "book.json")
    given = set(free_ports(20, book=book))
    for _ in range(20):
        again = free_ports(3, avoid=given, book=book)
        assert not given & set(again)
        given.update(again)
    assert isinstance(free_port(), int)


def test_the_book_holds_each_pick_until_its_time_is_up(tmp_path: Path) -> None:
    book = PortBook(tmp_path / "book.json", hold_s=60.0)
    picked = free_ports(3, book=book)
    assert book.held() == set(picked)
    with book.open(now_s=1e12) as held:  # long after: the holds have run out, and go
        assert held == {}
    assert book.held() == set()
    # Ports the book holds are left out of a pick, as the caller's own `avoid` is: with
    # every port held but the three picked above, a pick can only be one of them.
    with book.open() as held:
        held.update(dict.fromkeys(set(range(1024, 65536)) - set(picked), 1e12))
    assert free_ports(1, book=book)[0] in picked


def test_another_process_sees_the_ports_this_one_picked(tmp_path: Path) -> None:
    path = tmp_path / "book.json"
    script = (
        "import sys; from pathlib import Path; "
        "from servepilot.engine.ports import PortBook, free_ports; "
        f"print(*free_ports(3, book=PortBook(Path({str(path)!r}))))"
    )
    theirs = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True).stdout.split()  # fmt: skip
    assert {int(p) for p in theirs} <= PortBook(path).held()


def test_a_damaged_book_is_read_as_empty_and_written_anew(tmp_path: Path) -> None:
    path = tmp_path / "book.json"
    path.write_text("{not json")
    picked = free_ports(2, book=PortBook(path))
    assert {int(p) for p in json.loads(path.read_text())} == set(picked)


def test_a_replicas_ports_are_free_on_every_address() -> None:
    """vLLM binds its KV event sockets on `*`: a port taken on another address (here
    127.0.0.2, as another replica's or any server's) would fail it, so none is picked."""
    config = parse_config({"engine": {"kind": "sim"}}, origin="test")
    listeners = []
    try:
        for _ in range(400):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(sock)
            sock.bind(("127.0.0.2", 0))
            sock.listen()
        taken = {sock.getsockname()[1] for sock in listeners}
        for _ in range(30):
            port, kv = replica_ports(config)
            assert kv is not None
            for picked in (port, kv.publish, kv.replay):
                assert picked not in taken
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                    sock.bind(("0.0.0.0", picked))  # as vLLM's tcp://*:port
    finally:
        for sock in listeners:
            sock.close()


def test_without_a_book_the_picks_are_the_oss(tmp_path: Path) -> None:
    book = PortBook(tmp_path / "no such folder" / "book.json")
    assert len(set(free_ports(3, book=book))) == 3
    assert book.held() == set()
