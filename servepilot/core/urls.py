"""Server URLs as users type them."""

from __future__ import annotations

from servepilot.core.errors import ConfigError


def base_url(url: str, flag: str) -> str:
    """A server's root URL from what a user typed (a trailing /v1 or / is dropped); `flag`
    names where it was typed, for the error."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"{flag} {url!r}: expected a URL such as http://127.0.0.1:8000")
    url = url.rstrip("/")
    return url.removesuffix("/v1")
