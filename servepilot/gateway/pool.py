"""The registry of upstream replicas: live per-replica state, draining and health checks.

The pool owns the one shared HTTP client session (keep-alive connections to every replica)
and the background health checker. The proxy asks it for a `snapshot()` to route on, then
brackets each upstream request with `acquire()` / `release()` so in-flight counts stay true.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from yarl import URL

from servepilot.core.config import GatewayConfig
from servepilot.core.loop import cancel_and_wait
from servepilot.engine.metrics import NO_LOAD, parse_load
from servepilot.gateway.replica import Replica, ReplicaInfo, normalize_url
from servepilot.gateway.upstream import KEEPALIVE_S
from servepilot.routing.base import ReplicaView

log = logging.getLogger(__name__)

# How often draining (replica removal, gateway stop) looks at in-flight counts; polling keeps
# the per-request hot path free of wake-up bookkeeping.
_DRAIN_POLL_S = 0.02


class ReplicaNotFound(LookupError):
    """No replica with this id is registered."""


class DuplicateReplica(ValueError):
    """A replica with this id is already registered."""


class ReplicaPool:
    """Upstream replicas, their health and load, and the HTTP session used to reach them."""

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._replicas: dict[str, Replica] = {}
        self._known_models: frozenset[str] = frozenset()
        self._sole_model: str | None = None
        self._session: aiohttp.ClientSession | None = None
        self._checker: asyncio.Task[None] | None = None
        self._probe_timeout = aiohttp.ClientTimeout(total=config.connect_timeout_s)
        self._ids = itertools.count()
        self._on_remove: list[Callable[[str], None]] = []

    def on_remove(self, listener: Callable[[str], None]) -> None:
        """Call `listener(replica_id)` when a replica leaves (policies forget it)."""
        self._on_remove.append(listener)

    @property
    def session(self) -> aiohttp.ClientSession:
        """The shared client session; created on first use, inside the running loop."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    # --- registry -------------------------------------------------------------------------

    def new_id(self) -> str:
        while True:
            candidate = f"r{next(self._ids)}"
            if candidate not in self._replicas:
                return candidate

    async def add(
        self,
        replica_id: str,
        url: str,
        capacity: int | None = None,
        group: str | None = None,
        *,
        starting: bool = False,
    ) -> ReplicaInfo:
        """Register a replica and check it once, so a ready one is routable on return.

        `capacity` is its concurrency budget (default: gateway.admission.replica_concurrency).
        `starting`: it is still loading, so requests wait for it (up to cold_start_wait_s);
        otherwise it is taken as running, and a failed first check makes it down at once.
        """
        if replica_id in self._replicas:
            raise DuplicateReplica(f"a replica with id {replica_id!r} is already registered")
        replica = Replica(
            replica_id,
            normalize_url(url),
            capacity=capacity or self._config.admission.replica_concurrency,
            connect_timeout_s=self._config.connect_timeout_s,
            group=group,
            starting=starting,
        )
        self._replicas[replica_id] = replica
        await self._check(replica)
        log.info("replica %s added (%s), healthy=%s", replica_id, replica.url, replica.healthy)
        return replica.info()

    async def remove(self, replica_id: str, timeout_s: float) -> bool:
        """Stop routing to the replica, wait for its in-flight requests, then drop it.

        Returns whether it drained; after `timeout_s` it is dropped anyway (the requests
        still running on it finish or fail on their own).
        """
        replica = self._replicas.get(replica_id)
        if replica is None:
            raise ReplicaNotFound(replica_id)
        replica.draining = True
        drained = await wait_until(lambda: replica.in_flight == 0, timeout_s)
        if self._replicas.get(replica_id) is replica:
            del self._replicas[replica_id]
            replica.upstream.close()
            self._refresh_known_models()
            for listener in self._on_remove:
                listener(replica_id)
        log.info("replica %s removed (drained=%s)", replica_id, drained)
        return drained

    def set_budget(self, replica_id: str, budget: int) -> None:
        """Give the replica `budget` requests in flight at most, within [1, its hard
        capacity]. Lowered below its in-flight count, nothing is cut: its requests finish and
        new ones wait (or are refused) as when it is full; raised, the dispatcher's next tick
        (within BUSY_TICK_S while requests wait) hands the new slots out."""
        replica = self.live(replica_id)
        if not 1 <= budget <= replica.hard_capacity:
            raise ValueError(
                f"replica {replica_id}: budget {budget} outside [1, {replica.hard_capacity}]"
            )
        replica.capacity = budget

    def replicas(self) -> list[ReplicaInfo]:
        return [replica.info() for replica in self._replicas.values()]

    def get(self, replica_id: str) -> ReplicaInfo:
        return self.live(replica_id).info()

    def live(self, replica_id: str) -> Replica:
        """The replica's live state (for warm.py, which puts it to sleep and wakes it)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            raise ReplicaNotFound(replica_id)
        return replica

    # --- what the proxy asks --------------------------------------------------------------

    @property
    def known_models(self) -> frozenset[str]:
        """Every model id some registered replica said it serves (empty: none known yet)."""
        return self._known_models

    @property
    def sole_model(self) -> str | None:
        """The model of a fleet that serves one (every replica that said what it serves
        said the same names: vLLM lists each served name of its one model), by its first
        name; None when replicas serve different models or none has said."""
        return self._sole_model

    def snapshot(self, model: str | None = None) -> list[ReplicaView]:
        """Routable replicas (healthy, not draining, serving `model` if it is known)."""
        return [
            ReplicaView(
                replica_id=r.replica_id,
                in_flight=r.in_flight,
                num_requests_running=r.gauges.running,
                num_requests_waiting=r.gauges.waiting,
                kv_cache_usage=r.gauges.kv_cache_usage,
                capacity=r.capacity,
                group=r.group,
            )
            for r in self._replicas.values()
            if r.serving and (model is None or not r.model_ids or model in r.model_ids)
        ]

    def ready(self) -> bool:
        return any(r.serving for r in self._replicas.values())

    def starting(self) -> bool:
        """Whether some replica is still on its way up: handed over as starting, never
        healthy yet, and added less than `cold_start_wait_s` ago. A loading vLLM refuses
        connections just as a dead one does, so only time tells them apart: past that window
        the replica counts as down, and requests get their 503 at once instead of waiting for
        it. One handed over as running is never starting: nothing is worth waiting for."""
        now_s = time.monotonic()
        return any(self._starting(r, now_s) for r in self._replicas.values())

    def _starting(self, replica: Replica, now_s: float) -> bool:
        return (
            replica.starting
            and not replica.ever_healthy
            and not replica.draining
            and now_s - replica.added_at_s < self._config.admission.cold_start_wait_s
        )

    def model_cards(self) -> list[Mapping[str, Any]]:
        """The /v1/models entries of the routable replicas, one per model id."""
        cards: dict[str, Mapping[str, Any]] = {}
        for replica in self._replicas.values():
            if replica.serving:
                for card in replica.model_cards:
                    cards.setdefault(str(card["id"]), card)
        return list(cards.values())

    def acquire(self, replica_id: str) -> Replica:
        """Count a request as in flight on the replica; pair with `release` in a finally."""
        replica = self._replicas[replica_id]
        replica.in_flight += 1
        return replica

    @staticmethod
    def release(replica: Replica) -> None:
        replica.in_flight -= 1

    def record_failure(self, replica: Replica, cause: str) -> None:
        """A failed check or a refused/reset connection (`cause` says which); enough in a
        row take it out. Its going down is logged once, with how it was detected."""
        replica.consecutive_failures += 1
        if replica.healthy and replica.consecutive_failures >= self._config.unhealthy_after:
            replica.healthy = False
            log.warning(
                "replica %s (%s) is down, taken out of rotation: %d failures in a row, "
                "the last: %s",
                replica.replica_id,
                replica.url,
                replica.consecutive_failures,
                cause,
            )
        elif self._never_came_up(replica):
            replica.reported_down = True
            if replica.starting:
                why = (
                    f"not healthy once in the {self._config.admission.cold_start_wait_s:g} s "
                    "since it was added (cold_start_wait_s); the last check"
                )
            else:
                why = "it was added as running and its first check failed"
            log.warning("replica %s (%s) is down: %s: %s", replica.replica_id, replica.url,
                        why, cause)  # fmt: skip

    def mark_down(self, replica_id: str, cause: str) -> None:
        """Take a replica out of rotation now, on word from whoever runs it (its process
        exited), instead of after failed checks; a later healthy check puts it back."""
        replica = self._replicas.get(replica_id)
        if replica is None or replica.reported_down:
            return
        replica.reported_down = True
        replica.starting = False
        replica.healthy = False
        replica.consecutive_failures = max(
            replica.consecutive_failures, self._config.unhealthy_after
        )
        log.warning(
            "replica %s (%s) is down, taken out of rotation: %s",
            replica.replica_id,
            replica.url,
            cause,
        )

    def _never_came_up(self, replica: Replica) -> bool:
        """Past its startup window without a healthy check, and not yet reported."""
        if replica.ever_healthy or replica.reported_down or replica.draining:
            return False
        return not self._starting(replica, time.monotonic())

    @staticmethod
    def record_success(replica: Replica) -> None:
        replica.consecutive_failures = 0

    def total_in_flight(self) -> int:
        return sum(r.in_flight for r in self._replicas.values())

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight on any replica; False on timeout."""
        return await wait_until(lambda: self.total_in_flight() == 0, timeout_s)

    # --- health checking ------------------------------------------------------------------

    def start_health_checks(self) -> None:
        if self._checker is None or self._checker.done():
            self._checker = asyncio.create_task(self._check_loop(), name="replica-health")

    async def stop_health_checks(self) -> None:
        checker, self._checker = self._checker, None
        if checker is not None:
            await cancel_and_wait(checker)

    async def close(self) -> None:
        """Stop the health checker and close the client session (and its connections)."""
        await self.stop_health_checks()
        for replica in self._replicas.values():
            replica.upstream.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def check_all(self) -> None:
        """Check every replica once, concurrently; each check is bounded by its timeout."""
        await asyncio.gather(*(self._check(r) for r in list(self._replicas.values())))

    async def _check_loop(self) -> None:
        # Sleep first: `add` has just checked every replica.
        while True:
            await asyncio.sleep(self._config.health_interval_s)
            try:
                await self.check_all()
            except Exception:  # a bug here must not silently end health checking
                log.exception("health check round failed")

    async def _check(self, replica: Replica) -> None:
        failure = await self._health_failure(replica.endpoint("/health"))
        if failure is not None:
            self.record_failure(replica, f"GET /health: {failure}")
            return
        # Awaited untyped: gather's result is a list, where its stubs promise a tuple that
        # compiled code would insist on.
        both: Any = asyncio.gather(
            self._get_body(replica.endpoint("/metrics")),
            self._get_body(replica.endpoint("/v1/models")),
        )
        bodies = await both
        metrics_text: bytes | None = bodies[0]
        models_doc: bytes | None = bodies[1]
        if metrics_text is None:
            replica.gauges = NO_LOAD
        else:
            replica.gauges = parse_load(metrics_text.decode("utf-8", "replace"))
            replica.scraped_at_s = time.monotonic()
        if models_doc is not None:
            self._learn_models(replica, models_doc)
        replica.consecutive_failures = 0
        replica.ever_healthy = True
        replica.reported_down = False
        if not replica.healthy:
            replica.healthy = True
            log.info("replica %s is healthy and in rotation", replica.replica_id)

    async def _health_failure(self, url: URL) -> str | None:
        """Why the replica's /health is not a 200 (None: it is)."""
        try:
            async with self.session.get(url, timeout=self._probe_timeout) as resp:
                return None if resp.status == 200 else f"answered HTTP {resp.status}"
        except aiohttp.ClientConnectorError as exc:
            code = exc.os_error.errno
            return f"cannot connect ({os.strerror(code) if code else exc.os_error})"
        except TimeoutError:
            return f"no answer within {self._config.connect_timeout_s:g} s"
        except aiohttp.ClientError as exc:
            return f"{type(exc).__name__}: {exc}"

    async def _get_body(self, url: URL) -> bytes | None:
        """The body of a 200 answer, or None when the replica gave none in time."""
        try:
            async with self.session.get(url, timeout=self._probe_timeout) as resp:
                return await resp.read() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    def _learn_models(self, replica: Replica, body: bytes) -> None:
        try:
            doc = json.loads(body)
        except ValueError:
            return
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, list):
            return
        cards = tuple(c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str))
        replica.model_cards = cards
        ids = frozenset(str(c["id"]) for c in cards)
        if ids != replica.model_ids:
            replica.model_ids = ids
            self._refresh_known_models()

    def _refresh_known_models(self) -> None:
        told = [r for r in self._replicas.values() if r.model_ids]
        self._known_models = frozenset[str]().union(*(r.model_ids for r in told))
        one = len({r.model_ids for r in told}) == 1
        self._sole_model = str(told[0].model_cards[0]["id"]) if one else None


async def wait_until(condition: Callable[[], bool], timeout_s: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_DRAIN_POLL_S)
    return True
