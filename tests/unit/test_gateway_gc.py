"""The serving gateway's process freezes what it built before serving out of the collector."""

from __future__ import annotations

import gc

from servepilot.gateway.serve import freeze_when_started


def test_what_was_built_before_listening_is_frozen_then_started_is_told() -> None:
    ports: list[int] = []
    built = [object() for _ in range(1000)]  # long-lived, like the tokenizer's objects
    started = freeze_when_started(ports.append)
    gc.unfreeze()  # this test process: count from nothing frozen
    try:
        assert gc.get_freeze_count() == 0
        started(8000)
        assert ports == [8000]
        # Everything alive (the list above among it) is now out of the collections' walks.
        assert gc.get_freeze_count() >= len(built)
        gc.unfreeze()
        freeze_when_started(None)(8001)  # no callback: frozen all the same
        assert gc.get_freeze_count() >= len(built)
    finally:
        gc.unfreeze()  # give the test process its collector back
