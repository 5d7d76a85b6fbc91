"""The files store: uploaded batch inputs and the result files of batches, on disk, with
their OpenAI file objects in the batch database."""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servepilot.gateway.batch.db import Database

INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"


@dataclass(frozen=True, slots=True)
class StoredFile:
    file_id: str
    filename: str
    purpose: str
    size_bytes: int
    created_at: int
    path: Path

    def as_openai(self) -> dict[str, Any]:
        """The OpenAI `FileObject`."""
        return {
            "id": self.file_id,
            "object": "file",
            "bytes": self.size_bytes,
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "expires_at": None,
            "status_details": None,
        }


class FileStore:
    def __init__(self, db: Database, folder: Path) -> None:
        self._db = db
        self._folder = folder

    async def save(self, filename: str, purpose: str, content: bytes) -> StoredFile:
        """Write `content` to disk (synced), then record it: a row never names a missing file."""
        file_id = new_file_id()
        path = self._folder / f"{file_id}.jsonl"
        stored = StoredFile(file_id, filename, purpose, len(content), int(time.time()), path)
        await self._db.run(lambda conn: self.write_sync(conn, stored, content))
        return stored

    def write_sync(self, conn: sqlite3.Connection, stored: StoredFile, content: bytes) -> None:
        """On the store's thread, inside its transaction (also used to write result files)."""
        self._folder.mkdir(parents=True, exist_ok=True)
        with open(stored.path, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        conn.execute(
            "INSERT INTO files (id, filename, purpose, bytes, created_at, path) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (stored.file_id, stored.filename, stored.purpose, stored.size_bytes,
             stored.created_at, str(stored.path)),
        )  # fmt: skip

    def result_file(self, filename: str, content: bytes) -> StoredFile:
        file_id = new_file_id()
        path = self._folder / f"{file_id}.jsonl"
        return StoredFile(file_id, filename, OUTPUT_PURPOSE, len(content), int(time.time()), path)

    async def get(self, file_id: str) -> StoredFile | None:
        return await self._db.run(lambda conn: get_sync(conn, file_id))

    async def content(self, stored: StoredFile) -> bytes:
        return await self._db.run(lambda _: stored.path.read_bytes())


def get_sync(conn: sqlite3.Connection, file_id: str) -> StoredFile | None:
    row = conn.execute("SELECT * FROM files WHERE id = ?", (file_id,)).fetchone()
    if row is None:
        return None
    return StoredFile(
        row["id"], row["filename"], row["purpose"], row["bytes"], row["created_at"],
        Path(row["path"]),
    )  # fmt: skip


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"
