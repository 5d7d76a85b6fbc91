"""Session affinity: binding, TTL, fallback with rebinding, and the table bound."""

from __future__ import annotations

import random

from servepilot.core.config import RoutingConfig
from servepilot.routing import SessionAffinity
from servepilot.routing.base import ReplicaView, RequestView

CONFIG = RoutingConfig(session_ttl_s=10.0, session_table_size=100)


def views(*ids: str, busy: str | None = None, load: int = 50) -> list[ReplicaView]:
    return [ReplicaView(rid, in_flight=load if rid == busy else 0) for rid in ids]


def turn(session: str | None, at: float = 0.0) -> RequestView:
    return RequestView(model="m", session_id=session, arrival_s=at)


def counters(policy: SessionAffinity) -> tuple[float, float, float, float]:
    stats = policy.stats()
    return (
        stats["sessions"],
        stats["session_hits"],
        stats["session_misses"],
        stats["session_rebinds"],
    )


def test_a_session_binds_and_keeps_its_replica() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    candidates = views("a", "b", "c", "d")
    first = policy.choose(turn("s1", 0.0), candidates)
    picks = {policy.choose(turn("s1", float(t)), candidates) for t in range(1, 30)}
    assert picks == {first}
    assert counters(policy) == (1, 29, 1, 0)


def test_sessions_spread_over_replicas() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    candidates = views("a", "b", "c", "d")
    assert len({policy.choose(turn(f"s{i}"), candidates) for i in range(40)}) == 4


def test_binding_expires_ttl_after_its_last_use() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    candidates = views("a", "b")
    policy.choose(turn("s1", 0.0), candidates)
    policy.choose(turn("s1", 10.0), candidates)  # exactly the TTL: still bound, renewed
    policy.choose(turn("s1", 19.0), candidates)  # 9 s after the last use
    assert counters(policy) == (1, 2, 1, 0)
    policy.choose(turn("s1", 29.5), candidates)  # 10.5 s idle: expired, bound afresh
    assert counters(policy) == (1, 2, 2, 0)


def test_an_expired_binding_follows_the_load_again() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    assert policy.choose(turn("s1", 0.0), views("a")) == "a"
    later = views("a", "b", busy="a", load=2)  # under the line (2.25), but "b" is lighter
    assert policy.choose(turn("s1", 5.0), later) == "a"
    assert policy.choose(turn("s1", 100.0), later) == "b"


def test_missing_replica_falls_back_and_rebinds() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    assert policy.choose(turn("s1", 0.0), views("a")) == "a"
    # "a" is full or unhealthy: not among the candidates.
    assert policy.choose(turn("s1", 1.0), views("b", "c", busy="c")) == "b"
    assert counters(policy) == (1, 0, 1, 1)
    # "a" is back, but the session now lives on "b".
    assert policy.choose(turn("s1", 2.0), views("a", "b", "c")) == "b"
    assert counters(policy) == (1, 1, 1, 1)


def test_an_overloaded_replica_is_left_and_the_session_rebound() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    assert policy.choose(turn("s1", 0.0), views("a")) == "a"
    # Loads 50, 0, 0: mean 16.7, bound 1.25 x 16.7 + 1 = 21.8.
    hot = views("a", "b", "c", busy="a")
    moved = policy.choose(turn("s1", 1.0), hot)
    assert moved in {"b", "c"}
    assert counters(policy)[3] == 1
    assert policy.choose(turn("s1", 2.0), views("a", "b", "c")) == moved


def test_requests_without_a_session_use_least_load_and_count_nothing() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    candidates = views("a", "b", busy="a", load=5)
    assert {policy.choose(turn(None), candidates) for _ in range(20)} == {"b"}
    assert policy.choose(turn(""), candidates) == "b"
    assert counters(policy) == (0, 0, 0, 0)


def test_table_size_is_bounded_least_recently_used_first() -> None:
    config = RoutingConfig(session_ttl_s=1000.0, session_table_size=3)
    policy = SessionAffinity(config, random.Random(0))
    candidates = views("a", "b")
    for i, session in enumerate(["s1", "s2", "s3"]):
        policy.choose(turn(session, float(i)), candidates)
    policy.choose(turn("s1", 3.0), candidates)  # s1 is now the most recently used
    policy.choose(turn("s4", 4.0), candidates)  # evicts s2
    assert policy.stats()["sessions"] == 3
    misses = policy.stats()["session_misses"]
    policy.choose(turn("s1", 5.0), candidates)
    assert policy.stats()["session_misses"] == misses
    policy.choose(turn("s2", 6.0), candidates)
    assert policy.stats()["session_misses"] == misses + 1
    for i in range(50):
        policy.choose(turn(f"x{i}", 10.0 + i), candidates)
        assert policy.stats()["sessions"] <= 3


def test_expired_sessions_are_dropped_when_others_bind() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    candidates = views("a", "b")
    for i in range(5):
        policy.choose(turn(f"old{i}", float(i)), candidates)
    assert policy.stats()["sessions"] == 5
    policy.choose(turn("new", 100.0), candidates)
    assert policy.stats()["sessions"] == 1


def test_forget_drops_the_replicas_sessions() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    policy.choose(turn("on_a"), views("a"))
    policy.choose(turn("on_b"), views("b"))
    policy.forget("a")
    assert policy.stats()["sessions"] == 1
    assert policy.choose(turn("on_b", 1.0), views("a", "b")) == "b"


def test_out_of_order_arrivals_do_not_shorten_a_session() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    candidates = views("a", "b")
    policy.choose(turn("s1", 5.0), candidates)
    policy.choose(turn("s1", 4.0), candidates)  # reached the policy late
    policy.choose(turn("s1", 14.5), candidates)  # within the TTL of the use at 5.0
    assert counters(policy) == (1, 2, 1, 0)


def test_session_policy_identity() -> None:
    policy = SessionAffinity(CONFIG, random.Random(0))
    assert policy.name == "session"
    assert policy.uses_prefix is False
