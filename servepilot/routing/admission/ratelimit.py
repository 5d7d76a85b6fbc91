"""Per-API-key rate limits: token buckets."""

from __future__ import annotations

from collections.abc import Iterable

from servepilot.core.config import ApiKey

# Refills are sums of float products; without slack, 0.9999999999999998 tokens would refuse a
# request that is due.
_EPSILON = 1e-9


class TokenBucket:
    """`rate_per_s` requests per second on average, up to `burst` at once; starts full."""

    def __init__(self, rate_per_s: float, burst: int) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError("need rate_per_s > 0 and burst >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._last_s: float | None = None

    def try_take(self, now_s: float) -> bool:
        """Take one token if there is one."""
        self._refill(now_s)
        if self._tokens < 1.0 - _EPSILON:
            return False
        self._tokens = max(0.0, self._tokens - 1.0)
        return True

    def retry_after_s(self, now_s: float) -> float:
        """Seconds until a token is available (0.0 if one is now)."""
        self._refill(now_s)
        missing = 1.0 - self._tokens
        return 0.0 if missing <= _EPSILON else missing / self.rate_per_s

    def tokens(self, now_s: float) -> float:
        self._refill(now_s)
        return self._tokens

    def _refill(self, now_s: float) -> None:
        last_s = self._last_s
        # A clock that steps back neither refills nor moves the reference back.
        if last_s is not None and now_s <= last_s:
            return
        if last_s is not None:
            self._tokens = min(float(self.burst), self._tokens + (now_s - last_s) * self.rate_per_s)
        self._last_s = now_s


class KeyLimiter:
    """A token bucket per API key name, for the keys that set `rate_per_s`."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._buckets = {
            key.name: TokenBucket(key.rate_per_s, key.burst)
            for key in keys
            if key.rate_per_s is not None
        }

    def limited(self, key_name: str) -> bool:
        return key_name in self._buckets

    def bucket(self, key_name: str) -> TokenBucket | None:
        return self._buckets.get(key_name)

    def try_take(self, key_name: str, now_s: float) -> bool:
        """Whether the key may send a request now (always for an unlimited or unknown key)."""
        bucket = self._buckets.get(key_name)
        return bucket is None or bucket.try_take(now_s)

    def retry_after_s(self, key_name: str, now_s: float) -> float:
        bucket = self._buckets.get(key_name)
        return 0.0 if bucket is None else bucket.retry_after_s(now_s)
