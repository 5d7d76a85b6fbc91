"""What the server core raises to a handler and tells its owner of the requests it refused,
and what the client core reports of an exchange that failed.

Its own module, outside the modules `make gateway-fast` compiles (core/accel.py): mypyc
cannot compile a subclass of a builtin exception other than Exception itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.errors import EngineError


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


# The client core's failures: the project's one hierarchy (core/errors.py), so that a caller
# that lets one reach the user prints it as any other servepilot error.


class UpstreamFailed(EngineError):
    """A server could not be reached, or its answer broke off or was not HTTP."""


class Unreachable(UpstreamFailed):
    """No connection could be opened (refused, unresolvable, or not within the time given)."""

    def __init__(self, message: str, *, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class MalformedAnswer(UpstreamFailed):
    """The server's bytes are not an HTTP/1.x answer (or not one that was asked for)."""
