"""The OpenAI Files and Batch API on the gateway: jobs kept in SQLite, their lines run at
priority 2 through the gateway's own admission, on the capacity interactive traffic leaves
idle (see scheduler.py and aimd.py)."""

from __future__ import annotations

from servepilot.gateway.batch.api import BatchApi

__all__ = ["BatchApi"]
