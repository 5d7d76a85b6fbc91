"""What the tests of the simulated replica's KV events share: its flags (events on ports the
OS picks, blocks of 16 tokens, the embedded model's tokenizer), the gateway's hashing, and
prompts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from servepilot.engine.model_source import converted_embedded
from servepilot.routing.kv_index import DEFAULT_SEED, BlockHashing
from tests.unit.sim_support import BASE_ARGS

BS = 16
# As `up` tells the gateway: the replicas' PYTHONHASHSEED, else vLLM's fixed seed.
HASHING = BlockHashing(BS, os.environ.get("PYTHONHASHSEED", DEFAULT_SEED))
EVENTS = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                     "endpoint": "tcp://*:0", "replay_endpoint": "tcp://*:0"})  # fmt: skip
SYSTEM = "You answer questions about the geography of Europe, briefly and precisely. " * 6


def tokenizer_folder() -> Path:
    """The embedded model's folder: the tokenizer both the replica and the gateway use."""
    folder = converted_embedded()
    if folder is None:
        pytest.skip("the embedded model is not converted here (servepilot models pull)")
    return folder


def sim_args(*extra: str, events: bool = True) -> list[str]:
    """A simulated replica's flags: 2 ms steps, publishing its KV events unless `events` is
    False."""
    args = [*BASE_ARGS, "--step-ms", "2", "--block-size", str(BS)]
    args += ["--tokenizer", str(tokenizer_folder())]
    return [*args, *(["--kv-events-config", EVENTS] if events else []), *extra]


def chat(question: str, system: str = SYSTEM) -> dict[str, Any]:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    return {"model": "smollm2", "messages": messages, "max_tokens": 2}
