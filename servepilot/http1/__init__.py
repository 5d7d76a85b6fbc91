"""One HTTP/1.1 server core on uvloop + httptools, used by every server servepilot runs: the
gateway and the simulated vLLM replica; and one client core (`client`), used by every client
on the hot path: the gateway's upstream connections and bench's. It imports nothing of
servepilot but core; what each user adds (routes, error shapes, limits; pooling, retries,
measurements) is passed in or stays with it."""

from __future__ import annotations

from servepilot.http1.connection import HttpConnection
from servepilot.http1.errors import Disconnected, Rejected
from servepilot.http1.request import HttpRequest
from servepilot.http1.server import (
    ErrorBody,
    Handler,
    HttpServer,
    Limits,
    UploadLimit,
)

__all__ = [
    "Disconnected",
    "ErrorBody",
    "Handler",
    "HttpConnection",
    "HttpRequest",
    "HttpServer",
    "Limits",
    "Rejected",
    "UploadLimit",
]
