"""bench against a server that sheds load: 429 with Retry-After is waited out, not flooded."""

from __future__ import annotations

from typing import Any

from servepilot.bench.client import Target
from servepilot.bench.metrics import summarize
from servepilot.bench.records import RequestRecord, RequestSpec
from servepilot.bench.runner import LoadOutcome, LoadPlan, run_load
from servepilot.core import loop
from servepilot.core.results import Load, LoadMode, Run, Stats
from servepilot.core.slo import Slo
from servepilot.load.sweep import SweepConfig, next_step
from tests.support.stub_server import StubConfig, threaded_stub
from tests.unit.fake_upstream import FakeUpstream
from tests.unit.gateway_support import gateway_in_front_of, run

SPECS = [RequestSpec(index=i, prompt=f"p{i}", max_tokens=3, input_tokens=2) for i in range(8)]


def _load(url: str, plan: LoadPlan) -> LoadOutcome:
    outcome: LoadOutcome = loop.run(run_load(Target(url, "stub-model"), plan, SPECS))
    return outcome


def test_closed_loop_waits_out_retry_after() -> None:
    # 4 workers, a 0.5 s level, Retry-After 1: each worker sends once and waits to the end.
    # Without the wait they re-send at once: thousands of requests in half a second.
    plan = LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=4), duration_s=0.5, grace_s=0.5)
    with threaded_stub(StubConfig(refuse_retry_after="1")) as stub:
        outcome = _load(stub.url, plan)
        received = stub.server.stats.requests
    assert received == 4
    assert [r.error for r in outcome.records] == ["http_429"] * 4
    assert all(r.refused and r.retry_after_s == 1.0 for r in outcome.records)
    # Each worker waited until the level's end (0.5 s), not the whole second.
    assert 4 * 0.4 < outcome.retry_wait_s <= 4 * 0.5 + 0.01
    assert not outcome.client.client_bound  # the wait is the server's, not the client's lag


def test_closed_loop_resends_after_a_short_retry_after() -> None:
    plan = LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=2), duration_s=0.5, grace_s=0.5)
    with threaded_stub(StubConfig(refuse_retry_after="0.2")) as stub:
        outcome = _load(stub.url, plan)
        received = stub.server.stats.requests
    # Two workers, one request every 0.2 s each, for 0.5 s: at 0, 0.2, 0.4 s (on a busy
    # machine the third may come after the end).
    assert 4 <= received <= 6
    assert len(outcome.records) == received


def test_open_loop_refusals_are_counted_not_resent() -> None:
    plan = LoadPlan(Load(mode=LoadMode.RATE, value=50), max_requests=10)
    with threaded_stub(StubConfig(refuse_retry_after="5")) as stub:
        outcome = _load(stub.url, plan)
        received = stub.server.stats.requests
    assert received == 10
    run = summarize(plan.load, outcome.records, Slo(), duration_s=outcome.duration_s)
    assert (run.completed, run.failed, run.refused) == (0, 10, 10)
    assert outcome.retry_wait_s == 0.0


def _record(error: str | None, retry_after_s: float | None = None) -> RequestRecord:
    return RequestRecord(index=0, intended_s=0, sent_s=0, error=error, retry_after_s=retry_after_s)


def test_a_503_is_a_refusal_only_with_retry_after() -> None:
    assert _record("http_429").refused
    assert _record("http_503", 2.0).refused
    assert not _record("http_503").refused
    assert not _record("http_500", 2.0).refused
    assert not _record(None).refused


def _run(completed: int, failed: int, refused: int, **kw: Any) -> Run:
    empty = Stats(mean=None, p50=None, p90=None, p99=None)
    return Run(
        load=Load(mode=LoadMode.CONCURRENCY, value=64), duration_s=30.0, completed=completed,
        failed=failed, refused=refused, request_throughput=0.0, output_throughput=0.0,
        total_token_throughput=0.0, ttft_ms=empty, tpot_ms=empty, itl_ms=empty, e2e_ms=empty,
        goodput_rps=0.0, slo_attainment=0.0, **kw,
    )  # fmt: skip


def test_the_sweep_stop_reason_states_the_true_shares() -> None:
    step = next_step(SweepConfig(), [_run(completed=45, failed=20_445, refused=20_400)])
    assert step.load is None
    assert step.reason == (
        "at concurrency 64, >99% of 20,490 requests were refused by the server (429/503), "
        "<1% failed, <1% completed"
    )
    step = next_step(SweepConfig(), [_run(completed=50, failed=50, refused=0)])
    assert step.reason == "at concurrency 64, 50% of 100 requests failed, 50% completed"


def test_bench_against_a_shedding_gateway_waits_instead_of_flooding() -> None:
    # One replica slot, one queue place: of 8 workers 6 are refused (429, Retry-After 1) at
    # once; they wait to the level's end while the 2 admitted ones are served in turn.
    plan = LoadPlan(Load(mode=LoadMode.CONCURRENCY, value=8), duration_s=0.6, grace_s=1.0)
    got: list[LoadOutcome] = []

    async def body() -> None:
        upstream = await FakeUpstream("a", models=("stub-model",), capacity=1).start()
        upstream.reply_delay_s = 0.1
        async with gateway_in_front_of(
            [upstream], admission={"max_queued": 1}, retry_after_s=1
        ) as (_, url):
            got.append(await run_load(Target(url, "stub-model"), plan, SPECS))

    run(body(), timeout_s=20)
    records = got[0].records
    refused = [r for r in records if r.refused]
    assert len(refused) >= 6 and all(r.retry_after_s == 1.0 for r in refused)
    assert all(r.ok or r.refused for r in records)
    # Without the wait the refused workers re-send at once: hundreds of requests in 0.6 s.
    assert len(records) <= 6 + 2 * 8
