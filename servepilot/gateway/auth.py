"""API keys: who is calling, their class, their tenant, their rate limit; and the admin key.

With no keys configured the gateway is open and every caller is `ANONYMOUS` (class P1, or
what its X-Priority header asks, and one tenant). Keys are compared in constant time; the key
itself never appears in logs or metrics, only its name.
"""

from __future__ import annotations

import hmac
import math
import os
from dataclasses import dataclass

from servepilot.core.config import AuthConfig, Priority
from servepilot.core.errors import ConfigError
from servepilot.gateway.errors import AUTH, GatewayError, shed
from servepilot.routing.admission import TokenBucket


@dataclass(frozen=True, slots=True)
class Caller:
    name: str
    """The key's name ("anonymous" without auth): a metrics label."""
    priority: Priority
    """The class of its requests when they send no X-Priority header."""
    ceiling: Priority
    """The most urgent class an X-Priority header may ask for."""
    tenant: str
    """Whose fair share of the queue its requests count in (the key's `tenant`, else its
    name)."""


# Without keys nobody is accountable for a class, so the header decides (default P1).
ANONYMOUS = Caller("anonymous", Priority.P1, ceiling=Priority.P0, tenant="anonymous")
_BEARER = "bearer "


class Authenticator:
    """Checks bearer tokens against the configured keys and applies their rate limits."""

    def __init__(self, config: AuthConfig) -> None:
        self._keys: list[tuple[bytes, Caller, TokenBucket | None]] = []
        for key in config.keys:
            try:
                secret = key.secret()
            except ValueError as exc:
                raise ConfigError(f"gateway.auth.keys: {exc}") from None
            bucket = TokenBucket(key.rate_per_s, key.burst) if key.rate_per_s else None
            caller = Caller(key.name, key.priority, ceiling=key.priority, tenant=key.tenant_id)
            self._keys.append((secret.encode(), caller, bucket))
        self._admin: bytes | None = None
        if config.admin_key_env is not None:
            admin = os.environ.get(config.admin_key_env)
            if not admin:
                raise ConfigError(
                    f"gateway.auth.admin_key_env: environment variable "
                    f"{config.admin_key_env} is unset or empty"
                )
            self._admin = admin.encode()

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def tenants(self) -> list[str]:
        """The tenants of the configured callers (the anonymous one without keys)."""
        if not self._keys:
            return [ANONYMOUS.tenant]
        return list(dict.fromkeys(caller.tenant for _, caller, _ in self._keys))

    def caller(self, authorization: str | None, now_s: float) -> Caller:
        """The caller presenting `authorization`; 401 for a missing or unknown key, 429 when
        its rate limit is spent."""
        if not self._keys:
            return ANONYMOUS
        token = _token(authorization)
        for secret, caller, bucket in self._keys:
            if hmac.compare_digest(secret, token):
                if bucket is not None and not bucket.try_take(now_s):
                    wait_s = max(1, math.ceil(bucket.retry_after_s(now_s)))
                    raise shed(
                        f"the rate limit of key {caller.name!r} is reached; retry later",
                        "rate_limited",
                        wait_s,
                    )
                return caller
        raise _unauthorized("the API key is not valid")

    def check_admin(self, authorization: str | None) -> None:
        """Admin routes: open without auth; with keys configured, only the admin key."""
        if self._admin is None:
            if self._keys:
                raise GatewayError(
                    403,
                    "admin routes are closed: set gateway.auth.admin_key_env to open them",
                    error_type=AUTH,
                    code="admin_closed",
                )
            return
        if not hmac.compare_digest(self._admin, _token(authorization)):
            raise _unauthorized("the admin key is missing or not valid")


def _token(authorization: str | None) -> bytes:
    if authorization is None or not authorization.lower().startswith(_BEARER):
        raise _unauthorized("send the API key as `Authorization: Bearer <key>`")
    return authorization[len(_BEARER) :].strip().encode()


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(
        401,
        message,
        error_type=AUTH,
        code="invalid_api_key",
        headers={"WWW-Authenticate": "Bearer"},
    )
