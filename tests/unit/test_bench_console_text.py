"""The words bench (and sim) print about a level and a run, with known answers."""

from __future__ import annotations

from servepilot.bench.console import level_summary, progress_counts, run_warnings
from servepilot.bench.report.fmt import level_name
from servepilot.bench.shortfalls import LEAK_BYTES_PER_REQUEST
from servepilot.core.results import ClientHealth, Load, LoadMode, Run, Stats
from tests.unit.tune_support import run, stats


def test_a_level_is_named_by_its_load() -> None:
    assert level_name(Load(mode=LoadMode.CONCURRENCY, value=16)) == "concurrency 16"
    assert level_name(Load(mode=LoadMode.RATE, value=2.5)) == "rate 2.5/s"


def test_progress_counts_mention_failures_only_when_there_are_some() -> None:
    assert progress_counts(1234, 0) == "1,234 ok"
    assert progress_counts(12, 1) == "12 ok, 1 failed"


def test_a_finished_level_reads_as_counts_throughput_and_p99() -> None:
    done = run(4, 1.0, failed=2, e2e_ms=3456.0)
    assert level_summary(done) == "20 ok, 2 failed · 10.0 tok/s · P99 E2E 3,456 ms"
    shed = done.model_copy(update={"refused": 2})
    assert level_summary(shed) == "20 ok, 2 failed (2 refused) · 10.0 tok/s · P99 E2E 3,456 ms"


def test_a_run_warns_of_a_slow_client_and_of_a_leak() -> None:
    assert run_warnings(run(4, 1.0)) == ()
    slow = ClientHealth(
        requested_rate=10.0, achieved_rate=7.25, send_lag_ms=stats(1.0), client_bound=True
    )
    leaky = run(4, 1.0).model_copy(
        update={"client": slow, "memory_growth_bytes_per_request": LEAK_BYTES_PER_REQUEST + 2**20}
    )
    client, leak = run_warnings(leaky)
    assert client == (
        "at concurrency 4 the client fell behind (7.25 of 10 req/s sent, send lag p99 1 ms; "
        "more than 10 ms, or a rate short of the schedule, makes a client-bound run): the "
        "numbers understate the server; give the client a quieter or bigger machine, or "
        "--processes"
    )
    assert leak.startswith("memory grew 3.0 MiB per request during the soak")


def test_warnings_name_refusals_and_a_load_never_reached() -> None:
    empty = Stats(mean=None, p50=None, p90=None, p99=None)
    run = Run(
        load=Load(mode=LoadMode.CONCURRENCY, value=16), duration_s=3.0, completed=2, failed=10,
        refused=9, retry_wait_s=4.5, peak_in_flight=12, load_reached=False,
        request_throughput=0.0, output_throughput=0.0, total_token_throughput=0.0,
        ttft_ms=empty, tpot_ms=empty, itl_ms=empty, e2e_ms=empty, goodput_rps=0.0,
        slo_attainment=0.0,
    )  # fmt: skip
    assert run_warnings(run) == (
        "at concurrency 16 the server shed load: 75% of 12 requests were refused by the server "
        "(429/503), 8% failed, 17% completed; workers waited out Retry-After for 4.5 s in all",
        "concurrency 16 never reached its load: at most 12 requests were in flight, only 12 "
        "requests were sent (give --requests at least 16); not a candidate for the sweet spot",
    )


def test_the_exit_code_says_interrupted_and_all_failed_and_nothing_else() -> None:
    from servepilot.bench.console import ending
    from servepilot.core.results import BenchResult, Source

    def result(*runs_: Run, interrupted: bool = False) -> BenchResult:
        return BenchResult(source=Source.MEASURED, target={}, workload={}, runs=runs_,
                           interrupted=interrupted)  # fmt: skip

    ok = run(4, 1.0)
    dead = run(4, 0.0).model_copy(
        update={"completed": 0, "failed": 20, "errors": {"http_429": 15, "cancelled_at_end": 5}}
    )
    assert ending(result(ok, dead), measured=True) == (0, None)
    assert ending(result(ok, interrupted=True), measured=True) == (
        130, "interrupted after 1 finished level: the results above (and in --out) hold only those"
    )  # fmt: skip
    assert ending(result(dead, dead), measured=True) == (
        1, "no request succeeded: all 40 failed (see the errors above)"
    )  # fmt: skip
    # A simulation that mostly fails still describes the fleet (exit 0), and says so.
    assert ending(result(ok), measured=False) == (0, None)
    assert ending(result(dead), measured=False) == (
        0, "20 of 20 simulated requests failed (http_429 15, cancelled_at_end 5): this fleet "
        "does not carry this load"
    )  # fmt: skip
