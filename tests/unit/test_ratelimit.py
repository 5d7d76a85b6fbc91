"""Token buckets and the per-API-key limiter."""

from __future__ import annotations

import pytest

from servepilot.core.config import ApiKey
from servepilot.routing.admission import KeyLimiter, TokenBucket


def test_bucket_starts_full_lets_the_burst_through_then_the_rate() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=3)
    assert [bucket.try_take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.retry_after_s(0.0) == 0.5
    assert bucket.retry_after_s(0.25) == 0.25
    assert not bucket.try_take(0.25)
    assert bucket.try_take(0.5)
    assert not bucket.try_take(0.5)
    assert bucket.retry_after_s(0.5) == 0.5


def test_idle_refill_stops_at_the_burst() -> None:
    bucket = TokenBucket(rate_per_s=2.0, burst=3)
    bucket.try_take(0.0)
    assert bucket.tokens(100.0) == 3.0
    assert [bucket.try_take(100.0) for _ in range(4)] == [True, True, True, False]


def test_retry_after_is_zero_while_a_token_is_there() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=1)
    assert bucket.retry_after_s(0.0) == 0.0
    assert bucket.try_take(0.0)
    assert bucket.retry_after_s(0.0) == 1.0
    assert bucket.retry_after_s(0.75) == 0.25
    assert bucket.retry_after_s(1.0) == 0.0


def test_a_token_due_after_float_refills_is_not_refused() -> None:
    bucket = TokenBucket(rate_per_s=3.0, burst=1)
    assert bucket.try_take(0.0)
    # Seven refills of 1/21 s each add up to 0.9999999999999998 of a token.
    assert not any(bucket.try_take(i / 21.0) for i in range(1, 7))
    assert bucket.try_take(7 / 21.0)
    assert not bucket.try_take(7 / 21.0)


def test_a_clock_stepping_back_neither_refills_nor_rewinds() -> None:
    bucket = TokenBucket(rate_per_s=1.0, burst=1)
    assert bucket.try_take(10.0)
    assert not bucket.try_take(5.0)
    assert not bucket.try_take(10.5)
    assert bucket.try_take(11.0)


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_invalid_bucket_settings_are_refused(rate: float, burst: int) -> None:
    with pytest.raises(ValueError):
        TokenBucket(rate, burst)


def test_key_limiter_builds_buckets_only_for_rate_limited_keys() -> None:
    limiter = KeyLimiter(
        [
            ApiKey(name="batch", key="k1", rate_per_s=1.0, burst=2),
            ApiKey(name="free", key="k2"),
        ]
    )
    assert limiter.limited("batch")
    assert not limiter.limited("free")
    assert limiter.bucket("free") is None
    assert [limiter.try_take("batch", 0.0) for _ in range(3)] == [True, True, False]
    assert limiter.retry_after_s("batch", 0.0) == 1.0
    assert all(limiter.try_take("free", 0.0) for _ in range(100))
    assert limiter.try_take("unknown", 0.0)
    assert limiter.retry_after_s("free", 0.0) == 0.0
    assert limiter.try_take("batch", 1.0)
