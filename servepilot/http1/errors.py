"""What the server core raises to a handler, and tells its owner of the requests it refused.

Its own module, outside the modules `make gateway-fast` compiles (core/accel.py): mypyc
cannot compile a subclass of a builtin exception other than Exception itself.
"""

from __future__ import annotations

from dataclasses import dataclass


class Disconnected(ConnectionError):
    """The client went away; nothing more can be written to it."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """A request the server answered on its own before any handler saw it (malformed, or
    over a limit), for the server's owner to count and log."""

    status: int
    code: str
    """The error's code, as in its body (`body_too_large`...)."""
    method: str | None
    """None when the request line was not read as far (a malformed request)."""
    path: str | None
    """Without the query; cut short where a 431 stopped a request line mid-way. None as
    `method`."""
    body_bytes: int
    """Body bytes read before the refusal."""
    answer_bytes: int | None
    """The error body's size; None when it was not sent (an earlier pipelined request was
    still being answered: the connection closes after that one instead)."""
