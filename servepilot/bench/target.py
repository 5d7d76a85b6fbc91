"""Which model a target serves, when the user did not say."""

from __future__ import annotations

import json
import urllib.error
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
    except urllib.error.HTTPError as exc:
        # It answers, but not /v1/models as OpenAI's API has it.
        raise ConfigError(
            f"--url {root}: GET /v1/models answered {exc.code}: {server_message(exc.read())}",
            hint="pass --model NAME if the target serves OpenAI's API without /v1/models",
        ) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise ConfigError(
            f"--url {root}: cannot connect ({reason})",
            hint="is the server running on that address and port?",
        ) from None
    except (ValueError, KeyError, TypeError):
        raise ConfigError(
            f"--url {root}: GET /v1/models did not answer with OpenAI's model list",
            hint="pass --model NAME if the target serves OpenAI's API without /v1/models",
        ) from None
    if len(ids) != 1:
        raise ConfigError(
            f"{root} serves {len(ids)} models ({', '.join(ids) or 'none'})",
            hint="pick one with --model",
        )
    return ids[0]


def server_message(body: bytes | str) -> str:
    """The `error.message` of an OpenAI-shaped error body, else the body's start."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return text[:300].strip() or "(no body)"
    return str(message)
