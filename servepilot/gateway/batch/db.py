"""The batch store's SQLite connection, on a thread of its own.

Every statement runs on one worker thread (sqlite3 blocks), so the event loop never waits on
the disk and the connection is never shared between threads at once. WAL journaling: a
committed transaction survives a kill -9 of the gateway.

The file is created by the first write (an upload), so a gateway that never sees a batch
leaves nothing in the state folder. Several gateways may share a store (they all answer the
API), but only the one holding its lock file runs the jobs, so no line is sent twice; the
kernel drops the lock of a killed gateway, and another (or the restarted one) takes over.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL, created_at INTEGER NOT NULL, path TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, endpoint TEXT NOT NULL, input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL, in_progress_at INTEGER, finalizing_at INTEGER,
    completed_at INTEGER, failed_at INTEGER, expired_at INTEGER, cancelling_at INTEGER,
    cancelled_at INTEGER, output_file_id TEXT, error_file_id TEXT, errors TEXT,
    metadata TEXT, total INTEGER NOT NULL DEFAULT 0, completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0, seq INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status, expires_at);
CREATE TABLE IF NOT EXISTS lines (
    batch_id TEXT NOT NULL, idx INTEGER NOT NULL, custom_id TEXT NOT NULL,
    body TEXT NOT NULL, done INTEGER NOT NULL DEFAULT 0, ok INTEGER, result TEXT,
    attempts INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (batch_id, idx)
);
CREATE INDEX IF NOT EXISTS lines_pending ON lines (batch_id, done, idx);
"""


class Database:
    """One SQLite connection owned by one worker thread; `run` a function of it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-store")
        self._conn: sqlite3.Connection | None = None
        self._lock_fd: int | None = None

    def exists(self) -> bool:
        return self.path.exists()

    def claim(self) -> bool:
        """Hold the store's lock file (non-blocking); True while this process holds it."""
        if self._lock_fd is not None:
            return True
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(self._call, fn))

    async def close(self) -> None:
        if self._conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=True)
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._lock_fd)  # closing the descriptor drops the lock
            self._lock_fd = None

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = _connect(self.path)
        with self._conn:  # one transaction per call: committed, or rolled back on error
            return fn(self._conn)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: safe against a process kill
    conn.executescript(_SCHEMA)
    return conn
