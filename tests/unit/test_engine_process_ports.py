"""free_ports: ports picked together are all different and avoid those handed out already."""

from __future__ import annotations

import socket

from servepilot.engine.process import free_port, free_ports


def test_ports_picked_together_are_all_different_and_free() -> None:
    ports = free_ports(40)
    assert len(set(ports)) == 40
    for port in ports:  # each can be bound now: nothing listens there
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", port))


def test_ports_handed_out_already_are_not_given_again() -> None:
    given = set(free_ports(20))
    for _ in range(20):
        again = free_ports(3, avoid=given)
        assert not given & set(again)
        given.update(again)
    assert isinstance(free_port(), int)
