"""Tenant fair shares inside a priority class (routing/admission/fair.py, through the queue and
the driver): the order of service worked out by hand, the shares under a flood, the state of
idle tenants, and the arrival decision's wait prediction per tenant."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from servepilot.core.config import AdmissionConfig, GatewayConfig, Priority
from servepilot.routing.admission import (
    AdmissionDriver,
    AdmissionQueue,
    AdmitKind,
    Reason,
    Ticket,
)

P0, P1, P2 = Priority.P0, Priority.P1, Priority.P2
BUDGETS = (2e3, 1e4, 3e4)


def make_queue(weights: dict[str, float] | None = None, fair: bool = True) -> AdmissionQueue[str]:
    return AdmissionQueue(1e9, BUDGETS, weights, fair=fair)


def flood(queue: AdmissionQueue[str], tenant: str, count: int, at_s: float = 0.0) -> None:
    for i in range(1, count + 1):
        queue.push(f"{tenant}{i}", P1, now_s=at_s, tenant=tenant)


def drain(queue: AdmissionQueue[str], now_s: float = 1.0) -> list[str]:
    out: list[str] = []
    while (item := queue.pop(now_s)) is not None:
        out.append(item)
    return out


# --- the order of service ------------------------------------------------------------------


def test_equal_weights_alternate_between_a_flood_and_a_late_few() -> None:
    # a floods first; b's two come later. Turns of one request each: a, b, a, b, then a alone.
    queue = make_queue()
    flood(queue, "a", 6, at_s=0.0)
    flood(queue, "b", 2, at_s=0.5)
    assert drain(queue) == ["a1", "b1", "a2", "b2", "a3", "a4", "a5", "a6"]


def test_weights_three_to_one_serve_three_of_a_for_each_of_b() -> None:
    # Quanta 3 and 1: a's turn serves three, b's one.
    queue = make_queue({"a": 3.0, "b": 1.0})
    flood(queue, "a", 8)
    flood(queue, "b", 2)
    assert drain(queue) == ["a1", "a2", "a3", "b1", "a4", "a5", "a6", "b2", "a7", "a8"]


def test_weights_are_relative_to_the_smallest() -> None:
    # 0.5 and 1.5 are 1:3, as 1 and 3 are; an unnamed tenant weighs 1.0 (twice c's 0.5).
    queue = make_queue({"a": 1.5, "c": 0.5})
    flood(queue, "a", 4)
    flood(queue, "c", 2)
    assert drain(queue) == ["a1", "a2", "a3", "c1", "a4", "c2"]
    queue = make_queue({"c": 0.5})
    flood(queue, "x", 4)
    flood(queue, "c", 2)
    assert drain(queue) == ["x1", "x2", "c1", "x3", "x4", "c2"]


def test_shares_under_two_floods_follow_the_weights() -> None:
    queue = make_queue({"a": 3.0})
    flood(queue, "a", 400)
    flood(queue, "b", 400)
    first = [queue.pop(1.0) for _ in range(100)]
    assert Counter(str(item)[0] for item in first) == {"a": 75, "b": 25}


def test_a_newcomer_is_served_at_the_next_turn_not_behind_the_flood() -> None:
    queue = make_queue()
    flood(queue, "a", 50)
    assert [queue.pop(1.0) for _ in range(3)] == ["a1", "a2", "a3"]
    queue.push("b1", P1, now_s=1.0, tenant="b")
    assert queue.pop(1.0) == "b1"
    assert queue.pop(1.0) == "a4"


def test_without_fair_shares_the_class_is_first_come_first_served() -> None:
    queue = make_queue(fair=False)
    flood(queue, "a", 6, at_s=0.0)
    flood(queue, "b", 2, at_s=0.5)
    assert drain(queue) == ["a1", "a2", "a3", "a4", "a5", "a6", "b1", "b2"]


def test_classes_still_go_by_urgency_and_tenants_share_only_within_one() -> None:
    queue = make_queue()
    flood(queue, "a", 3)
    queue.push("b_p0", P0, now_s=0.5, tenant="b")
    queue.push("b_p2", P2, now_s=0.5, tenant="b")
    queue.push("b_p1", P1, now_s=0.5, tenant="b")
    assert drain(queue) == ["b_p0", "a1", "b_p1", "a2", "a3", "b_p2"]


def test_pop_if_declined_leaves_the_turns_as_they_were() -> None:
    queue = make_queue()
    flood(queue, "a", 3)
    flood(queue, "b", 3)
    assert queue.pop(1.0) == "a1"
    offered: list[str] = []

    def decline(item: str, now_s: float) -> bool:
        offered.append(item)
        return False

    for _ in range(3):
        assert not queue.pop_if(1.0, decline)
    assert offered == ["b1", "b1", "b1"]
    assert drain(queue) == ["b1", "a2", "b2", "a3", "b3"]


def test_in_order_is_the_order_pop_would_serve() -> None:
    queue = make_queue({"a": 2.0})
    flood(queue, "a", 5)
    flood(queue, "b", 3, at_s=0.5)
    queue.push("urgent", P0, now_s=0.7, tenant="b")
    order = [ticket.item for ticket in queue.in_order(1.0)]
    assert order == ["urgent", "a1", "a2", "b1", "a3", "a4", "b2", "a5", "b3"]
    assert drain(queue) == order


# --- state that grows shrinks ----------------------------------------------------------------


def test_a_tenant_whose_requests_are_all_served_is_forgotten() -> None:
    queue = make_queue({"a": 3.0})
    flood(queue, "a", 2)
    flood(queue, "b", 1)
    assert queue.depth_by_tenant() == {"a": 2, "b": 1}
    assert drain(queue) == ["a1", "a2", "b1"]
    assert queue.depth_by_tenant() == {}
    assert queue.held() == 0


def test_a_returning_tenant_gets_no_credit_for_its_absence() -> None:
    # a's turn ended with one request of credit left when its queue emptied (weight 3, two
    # served); back later, it gets one turn's worth again, not four.
    queue = make_queue({"a": 3.0})
    flood(queue, "a", 2)
    assert drain(queue) == ["a1", "a2"]
    flood(queue, "b", 5, at_s=2.0)
    for i in range(1, 6):
        queue.push(f"A{i}", P1, now_s=2.0, tenant="a")
    assert drain(queue, 3.0) == ["b1", "A1", "A2", "A3", "b2", "A4", "A5", "b3", "b4", "b5"]


def test_removed_and_expired_requests_leave_no_tenant_behind() -> None:
    queue = make_queue()
    tickets = [queue.push(f"a{i}", P1, now_s=0.0, tenant="a") for i in range(100)]
    queue.push("b1", P1, now_s=5.0, tenant="b")
    for ticket in tickets:
        assert queue.remove(ticket)
    assert queue.depth_by_tenant() == {"b": 1}
    assert queue.held() <= 2 * 64 + 2  # two FIFOs of dead entries at most, before compaction
    assert queue.expired(now_s=5.0 + BUDGETS[1] / 1000 + 1) == ["b1"]
    assert queue.depth() == 0 and queue.held() == 0


def test_the_last_request_leaving_frees_what_served_ones_left_behind() -> None:
    # b1 is served before a2, which arrived first (it stays behind in the arrival order);
    # a2 leaving, by service or by expiry, leaves the class empty, and nothing held.
    for leave in ("pop", "expire"):
        queue = make_queue()
        queue.push("a1", P1, now_s=0.0, tenant="a")
        queue.push("a2", P1, now_s=1.0, tenant="a")
        queue.push("b1", P1, now_s=2.0, tenant="b")
        assert [queue.pop(2.0), queue.pop(2.0)] == ["a1", "b1"]
        if leave == "pop":
            assert queue.pop(2.0) == "a2"
        else:
            assert queue.expired(now_s=11.5) == ["a2"]
        assert queue.held() == 0, leave


def test_expiry_takes_the_oldest_of_the_class_whatever_its_tenant() -> None:
    queue = make_queue()
    queue.push("a1", P1, now_s=0.0, tenant="a")
    queue.push("b1", P1, now_s=1.0, tenant="b")
    queue.push("a2", P1, now_s=2.0, tenant="a")
    assert queue.expired(now_s=11.5) == ["a1", "b1"]
    assert drain(queue, 11.5) == ["a2"]


def test_random_operations_keep_the_counts_true_and_each_tenant_first_in_first_out() -> None:
    rng = random.Random(3)
    queue = make_queue({"t0": 2.0, "t1": 0.5})
    live: dict[str, Ticket[str]] = {}
    served: dict[tuple[str, int], list[int]] = {}
    seq = 0
    for step in range(4000):
        now = step * 0.01
        move = rng.random()
        if move < 0.5:
            tenant, priority = f"t{rng.randrange(4)}", rng.randrange(3)
            ticket = queue.push(f"{tenant}-{priority}-{seq}", priority, now, tenant)
            live[ticket.item] = ticket
            seq += 1
        elif move < 0.8:
            item = queue.pop(now)
            if item is not None:
                del live[item]
                name, cls_, number = item.split("-")
                served.setdefault((name, int(cls_)), []).append(int(number))
        elif live:
            assert queue.remove(live.pop(rng.choice(sorted(live))))
        by_tenant = Counter(ticket.tenant for ticket in live.values())
        assert queue.depth() == len(live)
        assert queue.depth_by_tenant() == dict(by_tenant)
    # Within one tenant and one class, first in, first out (aging_s is far away here).
    assert len(served) == 12
    assert all(numbers == sorted(numbers) for numbers in served.values())
    drain(queue, 100.0)
    assert queue.held() == 0


# --- the arrival decision -------------------------------------------------------------------


def test_ahead_of_counts_the_turns_a_new_request_waits_for() -> None:
    queue = make_queue({"a": 3.0})
    flood(queue, "a", 10)
    queue.push("p0", P0, now_s=0.0, tenant="c")
    assert queue.ahead_of(P1, "b") == 1 + 3  # the P0, then one turn of a's (3)
    assert queue.ahead_of(P1, "a") == 1 + 10
    assert queue.ahead_of(P0, "b") == 1
    flood(queue, "b", 2)
    # b's third request waits for three turns: two of b's own and a's 3 per turn, 9 of them.
    assert queue.ahead_of(P1, "b") == 1 + 2 + 9
    assert make_queue(fair=False).ahead_of(P1, "b") == 0


@pytest.mark.parametrize("fair", [True, False])
def test_the_queue_budget_sheds_the_flooding_tenant_and_queues_the_other(fair: bool) -> None:
    # One dispatch a second and a P1 budget of 10 s: a's 20 queued would make a new request
    # wait 20 s (shed); under fair shares b's would wait for one of a's turns (1 s).
    admission = AdmissionConfig(queue_budget_ms=BUDGETS, fair_shares=fair)
    driver: AdmissionDriver[str] = AdmissionDriver(
        GatewayConfig(admission=admission), random.Random(0)
    )
    for i in range(20):
        driver.enqueue(f"a{i}", P1, 0.0, "a")
    for t in range(10):
        driver.dispatched(float(t))
    for_a = driver.decide(P1, free_slots=0, ready_replicas=1, starting=False, now_s=10.0,
                          tenant="a")  # fmt: skip
    for_b = driver.decide(P1, free_slots=0, ready_replicas=1, starting=False, now_s=10.0,
                          tenant="b")  # fmt: skip
    assert (for_a.kind, for_a.reason) == (AdmitKind.SHED_429, Reason.QUEUE_BUDGET)
    if fair:
        assert (for_b.kind, for_b.reason) == (AdmitKind.QUEUE, Reason.QUEUED)
    else:
        assert (for_b.kind, for_b.reason) == (AdmitKind.SHED_429, Reason.QUEUE_BUDGET)


def test_a_free_slot_goes_to_a_newcomer_whose_turn_comes_first() -> None:
    driver: AdmissionDriver[str] = AdmissionDriver(GatewayConfig(), random.Random(0))
    for i in range(5):
        driver.enqueue(f"a{i}", P1, 0.0, "a")
    # Two free slots (a release not pumped yet): one of a's turn, then b's.
    decide = driver.decide
    assert decide(P1, 2, 1, False, 1.0, tenant="b").kind is AdmitKind.DISPATCH
    assert decide(P1, 2, 1, False, 1.0, tenant="a").kind is AdmitKind.QUEUE


def test_config_refuses_a_weight_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="tenant_weights"):
        AdmissionConfig(tenant_weights={"a": 0.0})
    with pytest.raises(ValueError, match="weights"):
        AdmissionQueue(1.0, BUDGETS, {"a": -1.0})


# --- a full queue ---------------------------------------------------------------------------


def test_a_full_queue_pushes_out_the_newest_of_the_tenant_most_over_its_share() -> None:
    queue = make_queue({"a": 3.0})
    flood(queue, "a", 4)
    # Four places; a's share is 3 of them, b's 1: b has room, a's newest makes it.
    victim = queue.victim_for("b", P1, max_queued=4)
    assert victim is not None and victim.item == "a4"
    assert queue.victim_for("a", P1, max_queued=4) is None  # a is over its share
    queue.remove(victim)
    queue.push("b1", P1, now_s=1.0, tenant="b")
    assert queue.victim_for("b", P1, max_queued=4) is None  # b holds its share now
    assert make_queue(fair=False).victim_for("b", P1, max_queued=0) is None


def test_the_request_pushed_out_is_the_least_urgent_never_more_urgent_than_the_newcomer() -> None:
    queue = make_queue()
    for name, cls_ in [("a0", P0), ("a1", P1), ("a2", P2), ("a3", P1)]:
        queue.push(name, cls_, now_s=0.0, tenant="a")
    assert getattr(queue.victim_for("b", P1, max_queued=4), "item", None) == "a2"
    assert getattr(queue.victim_for("b", P0, max_queued=4), "item", None) == "a2"
    only_urgent = make_queue()
    flood(only_urgent, "a", 2)
    assert only_urgent.victim_for("b", P2, max_queued=2) is None  # a's are all P1


def test_a_full_queue_queues_the_tenant_under_its_share_and_sheds_the_flood() -> None:
    admission = AdmissionConfig(max_queued=2)
    driver: AdmissionDriver[str] = AdmissionDriver(
        GatewayConfig(admission=admission), random.Random(0)
    )
    driver.enqueue("a1", P1, 0.0, "a")
    driver.enqueue("a2", P1, 0.0, "a")
    for_a = driver.decide(P1, 0, 1, False, 1.0, tenant="a")
    for_b = driver.decide(P1, 0, 1, False, 1.0, tenant="b")
    assert (for_a.kind, for_a.reason) == (AdmitKind.SHED_429, Reason.QUEUE_FULL)
    assert (for_b.kind, for_b.reason) == (AdmitKind.QUEUE, Reason.QUEUED)
    driver.enqueue("b1", P1, 1.0, "b")
    assert driver.pushed_out == ["a2"]
    assert driver.queue.depth_by_tenant() == {"a": 1, "b": 1}
    # During a cold start too (no replica ready, one starting).
    cold = driver.decide(P1, 0, 0, True, 1.0, tenant="c")
    assert (cold.kind, cold.reason) == (AdmitKind.QUEUE, Reason.COLD_START)
