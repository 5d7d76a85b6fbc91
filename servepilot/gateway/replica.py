"""One upstream replica: its live state (mutable, owned by the pool and the dispatcher), the
record reported about it, and the prebuilt bytes of the requests sent to it."""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from yarl import URL

from servepilot.engine.metrics import NO_LOAD, LoadGauges
from servepilot.gateway.upstream import HostPool


class SleepState(enum.StrEnum):
    """Whether a replica serves or is held in the warm pool: only an awake one is routed to;
    the others are on their way, or a pool that wakes in about a second (asleep) or at once
    (parked)."""

    AWAKE = "awake"
    FALLING_ASLEEP = "falling asleep"
    """Taken out of rotation: its requests finish, then it is told to sleep (or parked)."""
    ASLEEP = "asleep"
    """vLLM's sleep mode: its weights in host memory, its GPU memory freed."""
    PARKED = "parked"
    """Running and loaded, not routed to (where the engine has no sleep mode: vLLM on CPU);
    it holds all its memory, and is back in rotation at once."""
    WAKING = "waking"
    """Told to wake; back in rotation once it says it is awake."""

    @property
    def held(self) -> bool:
        """In the warm pool, ready to be woken."""
        return self in (SleepState.ASLEEP, SleepState.PARKED)


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """One replica's state as reported by the admin API and the metrics."""

    replica_id: str
    url: str
    healthy: bool
    draining: bool
    in_flight: int
    consecutive_failures: int
    running: int
    waiting: int
    kv_cache_usage: float
    models: tuple[str, ...]
    capacity: int
    group: str | None
    scraped_at_s: float | None = None
    """When its gauges were last read (time.monotonic()); None: never. An autoscaler reads
    their age (not in the admin API's answer)."""
    sleep: SleepState = SleepState.AWAKE
    hard_capacity: int | None = None
    """The most `capacity` may be set to (the budget it was added with); None: `capacity`."""

    @property
    def ceiling(self) -> int:
        return self.capacity if self.hard_capacity is None else self.hard_capacity

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.replica_id,
            "url": self.url,
            "healthy": self.healthy,
            "draining": self.draining,
            "in_flight": self.in_flight,
            "consecutive_failures": self.consecutive_failures,
            "running": self.running,
            "waiting": self.waiting,
            "kv_cache_usage": self.kv_cache_usage,
            "models": list(self.models),
            "capacity": self.capacity,
            "hard_capacity": self.ceiling,
            "group": self.group,
            "sleep": self.sleep.value,
        }

    @property
    def serving(self) -> bool:
        """Routable: healthy, not draining, awake (what counts as ready capacity)."""
        return self.healthy and not self.draining and self.sleep is SleepState.AWAKE


class Replica:
    """Live, mutable state of one upstream replica (only the pool and the proxy touch it)."""

    __slots__ = (
        "_endpoints",
        "_heads",
        "added_at_s",
        "base_url",
        "capacity",
        "consecutive_failures",
        "draining",
        "ever_healthy",
        "gauges",
        "group",
        "hard_capacity",
        "header",
        "healthy",
        "in_flight",
        "model_cards",
        "model_ids",
        "replica_id",
        "reported_down",
        "scraped_at_s",
        "sleep",
        "starting",
        "upstream",
        "url",
    )

    def __init__(
        self,
        replica_id: str,
        url: str,
        *,
        capacity: int,
        connect_timeout_s: float,
        group: str | None = None,
        starting: bool = False,
    ) -> None:
        self.replica_id = replica_id
        self.url = url
        self.base_url = URL(url)
        self.capacity = capacity
        """Requests in flight the replica is given at most (its concurrency budget); an
        adaptive budget moves it within [1, hard_capacity] (`ReplicaPool.set_budget`)."""
        self.hard_capacity = capacity
        """The budget it was added with: what its batch and KV cache hold."""
        self.group = group
        host, port = self.base_url.host or "127.0.0.1", self.base_url.port or 80
        self.upstream = HostPool(host, port, connect_timeout_s)
        self.header = (b"x-servepilot-replica", replica_id.encode())
        self._heads: dict[str, bytes] = {}
        self.in_flight = 0
        self.consecutive_failures = 0
        # Not routable until a first check succeeds: a replica still loading its model
        # would otherwise get (and fail) the first requests.
        self.healthy = False
        self.draining = False
        self.sleep = SleepState.AWAKE
        self.ever_healthy = False
        self.starting = starting
        """Handed over while it loads: until its first healthy check (or its startup window
        closes) requests wait for it. A replica handed over as running is down at its first
        failed check."""
        self.added_at_s = time.monotonic()
        """When the gateway registered it (time.monotonic()): its startup window opens."""
        self.reported_down = False
        """Its never coming up was logged (once)."""
        self.gauges: LoadGauges = NO_LOAD
        self.scraped_at_s: float | None = None
        """When `gauges` were read (time.monotonic()); None: never."""
        self.model_cards: tuple[Mapping[str, Any], ...] = ()
        self.model_ids: frozenset[str] = frozenset()
        self._endpoints: dict[str, URL] = {}

    def endpoint(self, path: str) -> URL:
        """The replica's URL for `path`, built once per path (URL joins are not free)."""
        found = self._endpoints.get(path)
        if found is None:
            found = self._endpoints[path] = self.base_url.join(URL(path))
        return found

    def request_head(
        self, path: str, length: int, extra: bytes, content_type: bytes | None = None
    ) -> bytes:
        """The head of a POST of `length` bytes to `path` on this replica: JSON, unless
        `content_type` says otherwise (a multipart upload, whose boundary is in its type)."""
        start = self._heads.get(path)
        if start is None:
            start = self._heads[path] = (
                self._request_line(path) + b"content-type: application/json\r\n"
            )
        if content_type is not None:
            start = self._request_line(path) + b"content-type: %b\r\n" % content_type
        return b"%bcontent-length: %d\r\n%b\r\n" % (start, length, extra)

    def _request_line(self, path: str) -> bytes:
        """The request line and Host header of a POST to `path`."""
        host = f"{self.base_url.host}:{self.base_url.port}"
        return f"POST {self.base_url.path.rstrip('/')}{path} HTTP/1.1\r\nhost: {host}\r\n".encode()

    def info(self) -> ReplicaInfo:
        return ReplicaInfo(
            replica_id=self.replica_id,
            url=self.url,
            healthy=self.healthy,
            draining=self.draining,
            in_flight=self.in_flight,
            consecutive_failures=self.consecutive_failures,
            running=self.gauges.running,
            waiting=self.gauges.waiting,
            kv_cache_usage=self.gauges.kv_cache_usage,
            models=tuple(sorted(self.model_ids)),
            capacity=self.capacity,
            group=self.group,
            sleep=self.sleep,
            scraped_at_s=self.scraped_at_s,
            hard_capacity=self.hard_capacity,
        )

    @property
    def serving(self) -> bool:
        """Routable: healthy, not draining, awake."""
        return self.healthy and not self.draining and self.sleep is SleepState.AWAKE


def normalize_url(url: str) -> str:
    """`url` without a trailing slash; ValueError unless it is an absolute http(s) URL."""
    parsed = URL(url.strip())
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"replica url must look like http://host:port, got {url!r}")
    if parsed.scheme == "https":
        raise ValueError(
            f"replica url {url!r}: the gateway talks plain HTTP to its replicas "
            "(terminate TLS in front of the gateway, not behind it)"
        )
    return str(parsed).rstrip("/")
