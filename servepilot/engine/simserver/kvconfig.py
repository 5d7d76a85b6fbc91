"""The simulated replica's `--kv-events-config`: vLLM's KVEventsConfig, read from its JSON.

Same fields, defaults and rule as vLLM 0.32 (vllm/config/kv_events.py): without a
`publisher`, it is "zmq" when `enable_kv_cache_events` is true, else "null"; only "zmq"
publishes. What the replica answers to `GET /kv_event_sources` is this config with the
endpoints it bound, under its data-parallel rank ("0"), or `{}` when it publishes nothing
(what gateway/kv_sources.py reads).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from servepilot.core.errors import ConfigError

_PUBLISHERS = ("null", "zmq")
_FLAG = "--kv-events-config"


@dataclass(frozen=True, slots=True)
class KvEventsConfig:
    """vLLM's KVEventsConfig (field for field, in its order)."""

    enable_kv_cache_events: bool = False
    publisher: str = "null"
    endpoint: str = "tcp://*:5557"
    """The PUB socket: bound where it names every interface (`*`, `::`) or is ipc/inproc,
    else connected to (a broker that binds), as vLLM does."""
    replay_endpoint: str | None = None
    """The ROUTER socket that answers replay requests (always bound); None: no replay."""
    buffer_steps: int = 10_000
    """Batches kept for replay: the bound of the replay buffer."""
    hwm: int = 100_000
    """ZMQ's high-water mark of the PUB socket: past it, a slow subscriber misses batches."""
    max_queue_size: int = 100_000
    """vLLM's bound on batches waiting for its publisher thread; here nothing waits (a batch
    is sent as it is made), so it is only reported."""
    topic: str = ""

    @property
    def publishes(self) -> bool:
        return self.enable_kv_cache_events and self.publisher == "zmq"

    def bound_to(self, endpoint: str, replay_endpoint: str | None) -> KvEventsConfig:
        """The config with the endpoints the sockets were given (a port 0 resolved)."""
        return dataclasses.replace(self, endpoint=endpoint, replay_endpoint=replay_endpoint)

    def sources(self) -> dict[str, dict[str, Any]]:
        """vLLM's answer to GET /kv_event_sources: the config by rank; {} when not publishing."""
        return {"0": dataclasses.asdict(self)} if self.publishes else {}


def parse_kv_events_config(raw: str | None) -> KvEventsConfig:
    """The flag's JSON as vLLM reads it; None (no flag): nothing published. ConfigError for
    what vLLM refuses: not a JSON object, an unknown field, a value of the wrong type."""
    if raw is None:
        return KvEventsConfig()
    try:
        doc = json.loads(raw)
    except ValueError:
        raise ConfigError(f"{_FLAG} {raw!r}: not JSON") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{_FLAG} {raw!r}: not a JSON object")
    fields = {f.name: f for f in dataclasses.fields(KvEventsConfig)}
    for name, value in doc.items():
        if name not in fields:
            raise ConfigError(f"{_FLAG}: unknown field {name!r} (vLLM's: {', '.join(fields)})")
        _check_type(name, value)
    if doc.get("publisher") is None:
        doc["publisher"] = "zmq" if doc.get("enable_kv_cache_events") else "null"
    if doc["publisher"] not in _PUBLISHERS:
        raise ConfigError(
            f"{_FLAG}: publisher must be one of {_PUBLISHERS}, not {doc['publisher']!r}"
        )
    return KvEventsConfig(**doc)


def _check_type(name: str, value: Any) -> None:
    if name == "enable_kv_cache_events":
        ok = isinstance(value, bool)
    elif name in ("buffer_steps", "hwm", "max_queue_size"):
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif name in ("publisher", "replay_endpoint"):
        ok = value is None or isinstance(value, str)
    else:
        ok = isinstance(value, str)
    if not ok:
        raise ConfigError(f"{_FLAG}: {name} = {value!r} is not valid")
