"""Which model a target serves, when the user did not say."""

from __future__ import annotations

import json
import urllib.request

from servepilot.core.errors import ConfigError


def served_model(root: str, api_key: str | None) -> str:
    """The one model `root`'s /v1/models lists; an error names the ones it lists otherwise."""
    request = urllib.request.Request(f"{root}/v1/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            doc = json.loads(resp.read())
        ids = [str(m["id"]) for m in doc["data"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot list the models of {root} ({exc})", hint="pass --model NAME"
        ) from None
    if len(ids) != 1:
        raise ConfigError(
            f"{root} serves {len(ids)} models ({', '.join(ids) or 'none'})",
            hint="pick one with --model",
        )
    return ids[0]
