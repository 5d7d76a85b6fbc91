"""What `servepilot top` shows, from recorded pages: the gateway's /metrics and /admin/replicas
and the replicas' /metrics, scraped twice a minute apart."""

from pathlib import Path

import pytest

from servepilot.engine.metrics import EngineMetric, scrape
from servepilot.observe.top.sample import fleet_sample, replica_states
from servepilot.observe.top.view import TopView

FIXTURES = Path(__file__).parent.parent / "fixtures"
ADMIN = [
    {"id": "r0", "url": "http://127.0.0.1:9001", "healthy": True, "in_flight": 3, "running": 3,
     "waiting": 1, "kv_cache_usage": 0.42},
    {"id": "r1", "url": "http://127.0.0.1:9002", "healthy": False, "in_flight": 0, "running": 0,
     "waiting": 0, "kv_cache_usage": 0.0},
]  # fmt: skip


def gateway_page(fast: int, slow: int, shed: int, desired: str = "") -> str:
    """Class 0's TTFT: `fast` answers within 0.1 s, `slow` more within 1 s; `shed` class-2
    requests refused for a full queue."""
    return f"""\
# TYPE servepilot_ttft_seconds histogram
servepilot_ttft_seconds_bucket{{route="/v1/chat/completions",class="0",le="0.1"}} {fast}
servepilot_ttft_seconds_bucket{{route="/v1/chat/completions",class="0",le="1.0"}} {fast + slow}
servepilot_ttft_seconds_bucket{{route="/v1/chat/completions",class="0",le="+Inf"}} {fast + slow}
servepilot_ttft_seconds_count{{route="/v1/chat/completions",class="0"}} {fast + slow}
servepilot_ttft_seconds_sum{{route="/v1/chat/completions",class="0"}} 1.0
# TYPE servepilot_queue_depth gauge
servepilot_queue_depth{{class="0"}} 0
servepilot_queue_depth{{class="1"}} 4
servepilot_queue_depth{{class="2"}} 7
# TYPE servepilot_shed_total counter
servepilot_shed_total{{reason="queue_full",class="2"}} {shed}
{desired}"""


def replica_page(tpot_fast: int) -> str:
    return f"""\
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{{engine="0"}} 5
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_bucket{{engine="0",le="0.02"}} {tpot_fast}
vllm:request_time_per_output_token_seconds_bucket{{engine="0",le="0.05"}} 100
vllm:request_time_per_output_token_seconds_bucket{{engine="0",le="+Inf"}} 100
vllm:request_time_per_output_token_seconds_count{{engine="0"}} 100
vllm:request_time_per_output_token_seconds_sum{{engine="0"}} 3.0
"""


def test_the_last_minute_is_the_difference_of_two_scrapes() -> None:
    view = TopView(window_s=60.0)
    replicas = replica_states(ADMIN)
    view.add(fleet_sample(0.0, scrape(gateway_page(90, 10, 3)), replicas,
                          {"r0": scrape(replica_page(50))}))  # fmt: skip
    # In the minute since: 0 fast and 20 slow TTFTs, 4 more sheds.
    desired = "# TYPE servepilot_autoscale_desired_replicas gauge\n" \
              "servepilot_autoscale_desired_replicas 3\n"  # fmt: skip
    problem = ("r1: its /metrics did not answer",)
    view.add(fleet_sample(60.0, scrape(gateway_page(90, 30, 7, desired)), replicas,
                          {"r0": scrape(replica_page(50))}, problem))  # fmt: skip
    screen = view.screen("http://gw")
    # TTFT of class 0 in the window: 20 answers in (0.1, 1.0]: p50 = 0.1 + 0.9 x 10/20.
    assert screen.classes.rows[0] == ("0 interactive", "0", "550 ms", "991 ms", "20", "0")
    assert screen.classes.rows[2] == ("2 batch", "7", "—", "—", "0", "4")
    assert "last 60 s" in screen.classes.title
    # No TPOT in the window (the replica's histogram did not move): none shown, not stale.
    assert screen.headline == (
        "http://gw: 1 of 2 replicas healthy · 3 in flight · TPOT p50 —, p99 — (last 60 s) · "
        "autoscaler wants 3 replicas"
    )
    assert screen.replicas.rows == (
        ("r0", "yes", "3", "3", "1", "42%", "5"),
        ("r1", "NO", "0", "0", "0", "0%", "—"),
    )
    assert screen.notes == ("shed (last 60 s): queue_full 4", "r1: its /metrics did not answer")


def test_a_sleeping_replica_is_shown_asleep_not_healthy() -> None:
    asleep = [ADMIN[0], {**ADMIN[1], "healthy": True, "sleep": "asleep"}]
    view = TopView()
    view.add(fleet_sample(5.0, scrape(gateway_page(90, 10, 0)), replica_states(asleep),
                          {"r0": scrape(replica_page(50))}))  # fmt: skip
    screen = view.screen("http://gw")
    assert screen.headline.startswith("http://gw: 1 of 2 replicas healthy, 1 asleep · ")
    assert screen.replicas.rows[1][:2] == ("r1", "asleep")
    parked = [ADMIN[0], {**ADMIN[1], "healthy": True, "sleep": "parked"}]
    view.add(fleet_sample(6.0, scrape(gateway_page(90, 10, 0)), replica_states(parked),
                          {"r0": scrape(replica_page(50))}))  # fmt: skip
    screen = view.screen("http://gw")
    assert screen.headline.startswith("http://gw: 1 of 2 replicas healthy, 1 parked · ")
    assert screen.replicas.rows[1][:2] == ("r1", "parked")


def test_one_sample_counts_since_the_gateway_started() -> None:
    view = TopView()
    view.add(fleet_sample(5.0, scrape(gateway_page(90, 10, 0)), replica_states(ADMIN[:1]),
                          {"r0": scrape(replica_page(50))}))  # fmt: skip
    screen = view.screen("http://gw")
    # TTFT: 90 within 0.1 s, 10 within 1 s: p50 = 0.1 x 50/90; p99 = 0.1 + 0.9 x 9/10.
    assert screen.classes.rows[0][2:5] == ("56 ms", "910 ms", "100")
    # TPOT: 50 within 20 ms, 50 more within 50 ms: p50 = 20 ms, p99 = 20 + 30 x 49/50.
    assert "TPOT p50 20 ms, p99 49 ms (since the gateway started)" in screen.headline
    assert "autoscaler" not in screen.headline
    assert screen.notes == ("no request shed (since the gateway started)",)


def test_tpot_is_read_under_its_removed_name_too() -> None:
    legacy = scrape((FIXTURES / "metrics" / "vllm_legacy.txt").read_text())
    assert legacy.family(EngineMetric.TPOT) == "vllm:time_per_output_token_seconds"
    assert legacy.histogram(EngineMetric.TPOT).count == 600
    real = scrape((FIXTURES / "vllm" / "metrics_after_requests.txt").read_text())
    assert real.family(EngineMetric.TPOT) == "vllm:request_time_per_output_token_seconds"
    assert real.histogram(EngineMetric.TPOT).count == 2
    assert pytest.approx(0.0) != real.histogram(EngineMetric.TPOT).sum


def test_replicas_come_by_id_whichever_joined_the_gateway_first() -> None:
    """The gateway lists replicas in the order they became ready; a live look and a replay of
    the same fleet (doctor --from) must not depend on it."""
    admin = [{"id": rid, "url": f"http://h/{rid}", "healthy": True} for rid in ("r10", "r2", "r1")]
    assert [r.replica_id for r in replica_states(admin)] == ["r1", "r2", "r10"]
