"""The gateway's `batch:` section of fleet.yaml: the OpenAI Files and Batch API, its store and
how much of the fleet its jobs may take.

Batch lines run at priority 2 through the gateway's own admission; `max_concurrency` is the
ceiling of the adaptive window (AIMD) that decides how many run at once.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from servepilot.core.config.section import Section
from servepilot.core.paths import state_dir

SQLITE_SCHEME = "sqlite:///"


class BatchConfig(Section):
    enabled: bool = True
    """Serve /v1/files and /v1/batches and run batch jobs on idle capacity."""

    store: str | None = None
    """Where jobs and their lines are kept: sqlite:///relative/path or
    sqlite:////absolute/path (default: batch/batch.sqlite3 in the state folder). A restart
    resumes what was in progress there."""

    files_dir: str | None = None
    """Where uploaded input files and result files are written (default: batch/files in the
    state folder)."""

    max_file_bytes: int = Field(default=100 * 1024 * 1024, ge=1024)
    """Largest file POST /v1/files accepts; larger ones get 413."""

    max_concurrency: int = Field(default=64, ge=1)
    """Most batch lines in flight at once: the ceiling of the adaptive window, which halves
    on 429/5xx or growing interactive queues and grows back by one per window of successes."""

    reserve_share: float = Field(default=0.2, ge=0.0, lt=1.0)
    """Share of the replicas' slots (gateway.admission.replica_concurrency each) that batch
    lines leave free, so that an interactive arrival finds a slot at once instead of waiting
    for a batch line to end."""

    max_attempts: int = Field(default=3, ge=1)
    """Tries of a line whose replica fails (502/504) before it goes to the error file.
    A 429 or 503 (admission stepping aside for interactive traffic) is not an attempt."""

    @field_validator("store")
    @classmethod
    def _sqlite_url(cls, value: str | None) -> str | None:
        if value is not None and not (
            value.startswith(SQLITE_SCHEME) and len(value) > len(SQLITE_SCHEME)
        ):
            raise ValueError(f"must be {SQLITE_SCHEME}<path> (the embedded SQLite store)")
        return value

    def store_path(self) -> Path:
        if self.store is None:
            return state_dir() / "batch" / "batch.sqlite3"
        return Path(self.store[len(SQLITE_SCHEME) :])

    def files_path(self) -> Path:
        return Path(self.files_dir) if self.files_dir else state_dir() / "batch" / "files"
