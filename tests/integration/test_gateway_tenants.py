"""A noisy neighbour through the real gateway (`servepilot gateway`, its own process) in front of
a simulated vLLM replica (servepilot/engine/simserver) on 127.0.0.1.

Tenant a floods with many concurrent requests, tenant b sends a few at a time, both of class
P1, against a replica budget of a few slots. With fair shares b gets half the slots and its
requests wait a handful of slot turns; with one first-come-first-served queue per class (the
same run with `fair_shares: false`) b's requests wait behind a's whole flood and b gets the
share of its concurrency only.

Times are in slot turns measured by the run itself (the run's time per answer divided by the
slots), not in seconds: a loaded machine slows both runs alike.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.integration.gatewayproc import GatewayProcess, simulated_replica

# Long on the clock, light on the cores: handed out first (tests/integration/conftest.py).
pytestmark = pytest.mark.starts_first

MODEL = "smollm2"
SLOTS = 4
"""The replica's concurrency budget at the gateway (`--capacity`)."""
FLOOD = 32
"""Tenant a's concurrent requests."""
FEW = 4
"""Tenant b's."""
RUN_S = 6.0
SETTLE_S = 1.0
"""The first second of a run is left out: the flood has not filled the queue yet."""
KEYS = {"a": "sk-tenant-a", "b": "sk-tenant-b"}


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulated replica whose steps take 20 ms: a 16-token answer takes about 0.35 s."""
    with simulated_replica(tmp_path_factory.mktemp("replica"), MODEL, step_ms=20) as url:
        yield url


@dataclass(frozen=True)
class Done:
    tenant: str
    sent_s: float
    done_s: float
    status: int

    @property
    def e2e_s(self) -> float:
        return self.done_s - self.sent_s


async def _worker(
    session: aiohttp.ClientSession, url: str, tenant: str, end_s: float, out: list[Done]
) -> None:
    body = {"model": MODEL, "max_tokens": 16,
            "messages": [{"role": "user", "content": f"a question from {tenant}"}]}  # fmt: skip
    headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
    while (sent := time.monotonic()) < end_s:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            await r.read()
        out.append(Done(tenant, sent, time.monotonic(), r.status))


def _drive(url: str) -> tuple[list[Done], float]:
    """Both tenants for RUN_S; (every answer, when the run began)."""

    async def run() -> tuple[list[Done], float]:
        out: list[Done] = []
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            start = time.monotonic()
            end = start + RUN_S
            workers = [_worker(session, url, "a", end, out) for _ in range(FLOOD)]
            workers += [_worker(session, url, "b", end, out) for _ in range(FEW)]
            await asyncio.gather(*workers)
        return out, start

    return asyncio.run(run())


@dataclass(frozen=True)
class Run:
    b_share: float
    """b's share of the answers that ended in the measured window."""
    slot_turn_s: float
    """Time between two slot releases: the measured window over the answers that ended in
    it."""
    b_e2e_turns: list[float]
    """b's end-to-end times (queue wait included) in slot turns, sorted."""
    b_wait_turns: float
    """b's mean queue wait at the gateway (its per-tenant histogram), in slot turns."""
    admitted: dict[str, float]
    rejected: dict[str, float]
    queued: dict[str, float]


def _run(replica: str, workdir: Path, fair: bool) -> Run:
    settings = {
        "health_interval_s": 0.5,
        "admission": {"fair_shares": fair},
        "auth": {"keys": [{"name": name, "key": key} for name, key in KEYS.items()]},
        "access_log": {"enabled": False},
    }
    with GatewayProcess([replica], workdir, policy="least_load", capacity=SLOTS,
                        gateway=settings) as gateway:  # fmt: skip
        done, start = _drive(gateway.url)
        metrics = gateway.settled_metrics()
    assert {d.status for d in done} == {200}, sorted({d.status for d in done})
    # Answers that ended while both tenants were still sending (after it, a's queue drains).
    window = [d for d in done if start + SETTLE_S <= d.done_s < start + RUN_S]
    turn_s = (RUN_S - SETTLE_S) / len(window)
    b = [d for d in window if d.tenant == "b"]
    return Run(
        b_share=len(b) / len(window),
        slot_turn_s=turn_s,
        b_e2e_turns=sorted(d.e2e_s / turn_s for d in b),
        b_wait_turns=metrics.value("servepilot_tenant_queue_wait_seconds_sum", tenant="b")
        / metrics.value("servepilot_tenant_queue_wait_seconds_count", tenant="b")
        / turn_s,
        admitted=metrics.by_label("servepilot_tenant_admitted_total", "tenant"),
        rejected=metrics.by_label("servepilot_tenant_rejected_total", "tenant"),
        queued=metrics.by_label("servepilot_tenant_queued_total", "tenant"),
    )


def _p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


def test_a_flooding_tenant_does_not_starve_another_of_the_same_class(
    replica: str, tmp_path: Path
) -> None:
    fair = _run(replica, tmp_path / "fair", fair=True)
    fifo = _run(replica, tmp_path / "fifo", fair=False)
    for name, run in (("fair", fair), ("fifo", fifo)):
        print(
            f"{name}: b share {run.b_share:.2f}, b queue wait {run.b_wait_turns:.1f}, b e2e "
            f"p50/p90 {_p(run.b_e2e_turns, 0.5):.1f}/{_p(run.b_e2e_turns, 0.9):.1f} slot turns "
            f"of {run.slot_turn_s * 1000:.0f} ms"
        )
    # b has FEW requests out at all times, so it always has one waiting: equal weights give
    # it every other slot (0.5). First come, first served gives it its share of the
    # requests out, FEW / (FLOOD + FEW) = 0.11.
    assert fair.b_share >= 0.4
    assert fifo.b_share <= 0.2
    # A b request waits for its own requests queued ahead (FEW - SLOTS / 2 on average, b
    # holding half the slots) and as many of a's turns between them: about FEW turns, at
    # most 2 x FEW; it is answered SLOTS turns later. Behind the whole flood it waits about
    # FLOOD + FEW - SLOTS = 32 turns.
    assert fair.b_wait_turns <= 2 * FEW
    assert statistics.median(fair.b_e2e_turns) <= 2 * FEW + SLOTS
    assert fifo.b_wait_turns >= 20
    assert statistics.median(fifo.b_e2e_turns) >= 2 * statistics.median(fair.b_e2e_turns)
    # The gateway counted both tenants' admissions; nobody was refused.
    for run in (fair, fifo):
        assert run.admitted["a"] > 0 and run.admitted["b"] > 0
        assert run.rejected == {"a": 0.0, "b": 0.0, "batch": 0.0, "other": 0.0}
        assert run.queued["b"] > 0
    assert fair.admitted["b"] > 2 * fifo.admitted["b"]
