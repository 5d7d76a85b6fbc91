"""The access log: one JSON line per request, written off the request path.

JSON lines rather than the common log format: a line has fields that only some requests have
(the replica, TTFT of a stream, the error), which the common format has no place for, and
`jq` or any JSON reader splits them without a format-specific parser.

A request's handler only appends a tuple to an in-memory list (no formatting, no I/O); one
owned background task turns what has gathered into lines and writes them, in a worker thread,
every `flush_interval_ms` or once `flush_lines` wait. The list is bounded: when it is full the
line is dropped and counted, so a stalled disk never holds a request up. `close()` writes what
is left (a clean stop loses no line).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import time
from pathlib import Path
from typing import IO, Any

from servepilot.core.config import AccessLogConfig
from servepilot.core.errors import ConfigError

log = logging.getLogger(__name__)

CLIENT_DISCONNECTED = "client_disconnected"
# What the status of a line is when no status was answered: nginx's "client closed request".
CLIENT_CLOSED_STATUS = 499
_PATH_CHARS = 200  # a scanner's long paths do not make long lines
# One encoder for every line: json.dumps with non-default separators builds one per call.
_ENCODE = json.JSONEncoder(separators=(",", ":")).encode
_USAGE = {
    name: re.compile(rb'"%b"\s*:\s*(\d+)' % name.encode())
    for name in ("prompt_tokens", "completion_tokens")
}


class Trail:
    """What the proxy learns of one request on its way, for its line (mutable, one owner)."""

    __slots__ = (
        "bytes_out", "error", "model", "priority", "prompt_chars", "replica", "replicas", "stream",
        "tail",
        "ttfb_s", "ttft_s",
    )  # fmt: skip

    def __init__(self) -> None:
        self.replica: str | None = None
        self.replicas: tuple[str, ...] | None = None
        """Every replica a continued stream went through, in order (None: not continued)."""
        self.priority: int | None = None
        self.model: str | None = None
        self.stream: bool | None = None
        self.prompt_chars: int | None = None
        self.ttfb_s: float | None = None
        self.ttft_s: float | None = None
        self.bytes_out: int | None = None
        self.tail = b""
        """The last bytes of the answer, where an OpenAI answer carries its `usage`."""
        self.error: str | None = None
        """The code of an error in an answer that began well (a stream's error event)."""


# (end wall-clock time, e2e seconds, method, path, status, request bytes, trail, error code);
# e2e, method and path are None for what the HTTP server refused before routing (see record).
_Entry = tuple[float, float | None, str | None, str | None, int, int, Trail, str | None]


class AccessLog:
    """The bounded buffer and the task that writes it to `path`."""

    def __init__(self, config: AccessLogConfig, path: Path) -> None:
        self.path = path
        self._rate = config.sample_rate
        self._interval_s = config.flush_interval_ms / 1000.0
        self._flush_lines = config.flush_lines
        self._max_lines = config.buffer_lines
        self._buffer: list[_Entry] = []
        self._seen = 0
        self._taken = 0
        self.written = 0
        """Lines written to the file."""
        self.dropped: dict[str, int] = {"buffer_full": 0, "write_failed": 0}
        """Lines lost, by why."""
        self._file: IO[str] | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closing = False

    @property
    def buffered(self) -> int:
        """Lines waiting in memory for the next write."""
        return len(self._buffer)

    # --- the request path -----------------------------------------------------------------

    def sampled(self) -> bool:
        """Whether this answered request gets a line: `floor(n x sample_rate)` of the first
        n do, evenly spread, so the count is exact rather than a random draw's."""
        self._seen += 1
        # The guard keeps 0.29 x 100 (28.999...) from losing a line to float rounding.
        due = int(self._seen * self._rate + 1e-9)
        if due > self._taken:
            self._taken = due
            return True
        return False

    def record(
        self,
        method: str | None,
        path: str | None,
        status: int,
        e2e_s: float | None,
        bytes_in: int,
        trail: Trail,
        error: str | None,
    ) -> None:
        """Queue the line of a finished request; never waits, never writes. `e2e_s` is None
        for a request refused before routing (its arrival is not timed: that would cost every
        request), `method` and `path` too when the request was malformed."""
        buffer = self._buffer
        if len(buffer) >= self._max_lines:
            self.dropped["buffer_full"] += 1
            return
        buffer.append((time.time(), e2e_s, method, path, status, bytes_in, trail, error))
        if len(buffer) == self._flush_lines:
            self._wake.set()

    # --- the writer -----------------------------------------------------------------------

    def start(self) -> None:
        """Open the file (ConfigError when it cannot be written) and start the writer."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (see close())
        except OSError as exc:
            raise ConfigError(
                f"the access log {self.path} cannot be written: {exc.strerror}",
                hint="pass --access-log (or set gateway.access_log.path to) a file in a folder "
                "you can write to",
            ) from None
        self._task = asyncio.get_running_loop().create_task(self._run(), name="access-log")

    async def close(self) -> None:
        """Write every line still buffered, then close the file."""
        task, self._task = self._task, None
        if task is not None:
            self._closing = True
            self._wake.set()
            await task
        if self._file is not None:
            self._file.close()
            self._file = None

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()
        await self.flush()  # what came in while the last write ran

    async def flush(self) -> None:
        """Write what is buffered now (lines that arrive meanwhile wait for the next one)."""
        entries, self._buffer = self._buffer, []
        if not entries or self._file is None:
            return
        text = "".join(line(entry) for entry in entries)
        try:
            await asyncio.to_thread(_write, self._file, text)
        except OSError as exc:
            if not self.dropped["write_failed"]:
                log.warning("cannot write the access log %s: %s", self.path, exc)
            self.dropped["write_failed"] += len(entries)
            return
        self.written += len(entries)


def _write(file: IO[str], text: str) -> None:
    file.write(text)
    file.flush()


def line(entry: _Entry) -> str:
    """One JSON line (newline included); the request's arrival time leads it."""
    end_s, e2e_s, method, path, status, bytes_in, trail, error = entry
    tail = trail.tail
    counted = b"_tokens" in tail  # one scan; most streams carry no usage
    doc: dict[str, Any] = {
        "time": _utc(end_s - (e2e_s or 0.0)),
        "method": method,
        "path": None if path is None else path[:_PATH_CHARS],
        "status": status,
        "replica": trail.replica,
        "class": trail.priority,
        "model": trail.model,
        "stream": trail.stream,
        "prompt_chars": trail.prompt_chars,
        "prompt_tokens": _usage(tail, "prompt_tokens") if counted else None,
        "output_tokens": _usage(tail, "completion_tokens") if counted else None,
        "ttfb_ms": _ms(trail.ttfb_s),
        "ttft_ms": _ms(trail.ttft_s),
        "e2e_ms": _ms(e2e_s),
        "bytes_in": bytes_in,
        "bytes_out": trail.bytes_out,
        "error": error,
    }
    if trail.replicas is not None:  # a continued stream: every replica it went through
        doc["replicas"] = list(trail.replicas)
    return _ENCODE(doc) + "\n"


def _utc(at_s: float) -> str:
    """ISO 8601 in UTC to the millisecond, e.g. 2026-12-01T14:50:00.123Z."""
    second = int(at_s)
    return f"{_utc_second(second)}.{int((at_s - second) * 1000):03d}Z"


@functools.lru_cache(maxsize=4)
def _utc_second(second: int) -> str:
    """The lines of one flush share a handful of seconds: each is formatted once."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)


def _usage(tail: bytes, name: str) -> int | None:
    """A count from the answer's `usage` (present in non-streamed answers, and in streams
    asked with stream_options.include_usage); None when the tail does not carry it."""
    found = _USAGE[name].search(tail)
    return int(found.group(1)) if found else None
