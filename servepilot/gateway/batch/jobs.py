"""The job store: batches and their lines in the batch database.

A line is done once its result row is committed, in the same transaction as the batch's
counts; a line still pending after a crash is sent again. Result files are written from the
done rows, one per line, so each custom_id appears once whatever was retried.
"""

from __future__ import annotations

import enum
import json
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servepilot.gateway.batch.db import Database
from servepilot.gateway.batch.files import FileStore
from servepilot.gateway.batch.lines import InputLine, LineError


class Status(enum.StrEnum):
    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


ACTIVE = (Status.IN_PROGRESS, Status.FINALIZING, Status.CANCELLING)
# The end each active state leads to, and the timestamp column set then.
_ENDINGS = {Status.COMPLETED: "completed_at", Status.EXPIRED: "expired_at",
            Status.CANCELLED: "cancelled_at"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class PendingLine:
    batch_id: str
    index: int
    custom_id: str
    body: str
    attempts: int


@dataclass(frozen=True, slots=True)
class ActiveBatch:
    batch_id: str
    status: Status
    endpoint: str
    expires_at: int
    pending: int


class JobStore:
    def __init__(
        self, db: Database, files: FileStore, clock: Callable[[], float] = time.time
    ) -> None:
        self._db = db
        self._files = files
        self.clock = clock
        """Wall-clock seconds: deadlines and the OpenAI objects' timestamps."""

    def claim(self) -> bool:
        """The store exists and this process runs its jobs (see `Database.claim`)."""
        return self._db.exists() and self._db.claim()

    async def create(
        self,
        endpoint: str,
        input_file_id: str,
        window_s: int,
        window: str,
        metadata: dict[str, str] | None,
        lines: list[InputLine],
        errors: list[LineError],
    ) -> dict[str, Any]:
        now = int(self.clock())
        batch_id = f"batch_{uuid.uuid4().hex[:24]}"
        status = Status.FAILED if errors else Status.IN_PROGRESS
        error_doc = {"object": "list", "data": [e.as_openai() for e in errors]}

        def insert(conn: sqlite3.Connection) -> dict[str, Any]:
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM batches").fetchone()[0]
            conn.execute(
                "INSERT INTO batches (id, endpoint, input_file_id, completion_window, status, "
                "created_at, expires_at, in_progress_at, failed_at, errors, metadata, total, seq)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (batch_id, endpoint, input_file_id, window, status, now, now + window_s,
                 None if errors else now, now if errors else None,
                 json.dumps(error_doc) if errors else None,
                 json.dumps(metadata) if metadata is not None else None,
                 0 if errors else len(lines), seq),
            )  # fmt: skip
            if not errors:
                conn.executemany(
                    "INSERT INTO lines (batch_id, idx, custom_id, body) VALUES (?, ?, ?, ?)",
                    [(batch_id, ln.index, ln.custom_id, ln.body) for ln in lines],
                )
            return _get_sync(conn, batch_id) or {}

        return await self._db.run(insert)

    async def get(self, batch_id: str) -> dict[str, Any] | None:
        return await self._db.run(lambda conn: _get_sync(conn, batch_id))

    async def page(self, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        """Newest first, those created before `after`; and whether more follow."""

        def select(conn: sqlite3.Connection) -> tuple[list[dict[str, Any]], bool]:
            bound = 1 << 62
            if after is not None:
                row = conn.execute("SELECT seq FROM batches WHERE id = ?", (after,)).fetchone()
                bound = row["seq"] if row is not None else bound
            rows = conn.execute(
                "SELECT * FROM batches WHERE seq < ? ORDER BY seq DESC LIMIT ?", (bound, limit + 1)
            ).fetchall()
            return [_as_openai(r) for r in rows[:limit]], len(rows) > limit

        return await self._db.run(select)

    async def cancel(self, batch_id: str) -> dict[str, Any] | None:
        """in_progress -> cancelling (the scheduler ends it); other states stay as they are."""

        def update(conn: sqlite3.Connection) -> dict[str, Any] | None:
            conn.execute(
                "UPDATE batches SET status = ?, cancelling_at = ? WHERE id = ? AND status = ?",
                (Status.CANCELLING, int(self.clock()), batch_id, Status.IN_PROGRESS),
            )
            return _get_sync(conn, batch_id)

        return await self._db.run(update)

    async def active(self) -> list[ActiveBatch]:
        """Batches the scheduler still owes work, earliest deadline first."""

        def select(conn: sqlite3.Connection) -> list[ActiveBatch]:
            rows = conn.execute(
                "SELECT b.id, b.status, b.endpoint, b.expires_at, "
                "(SELECT COUNT(*) FROM lines l WHERE l.batch_id = b.id AND l.done = 0) AS pending "
                "FROM batches b WHERE b.status IN (?, ?, ?) ORDER BY b.expires_at, b.seq",
                tuple(ACTIVE),
            ).fetchall()
            return [ActiveBatch(r["id"], Status(r["status"]), r["endpoint"], r["expires_at"],
                                r["pending"]) for r in rows]  # fmt: skip

        return await self._db.run(select)

    async def pending(self, batch_id: str, limit: int, skip: set[int]) -> list[PendingLine]:
        def select(conn: sqlite3.Connection) -> list[PendingLine]:
            rows = conn.execute(
                "SELECT idx, custom_id, body, attempts FROM lines "
                "WHERE batch_id = ? AND done = 0 ORDER BY idx LIMIT ?",
                (batch_id, limit + len(skip)),
            ).fetchall()
            found = [PendingLine(batch_id, r["idx"], r["custom_id"], r["body"], r["attempts"])
                     for r in rows if r["idx"] not in skip]  # fmt: skip
            return found[:limit]

        return await self._db.run(select)

    async def count_attempt(self, line: PendingLine) -> None:
        await self._db.run(lambda conn: conn.execute(
            "UPDATE lines SET attempts = attempts + 1 WHERE batch_id = ? AND idx = ?",
            (line.batch_id, line.index),
        ))  # fmt: skip

    async def commit(self, line: PendingLine, ok: bool, result: dict[str, Any]) -> None:
        """The line is done: its result and the batch's counts, in one transaction."""

        def update(conn: sqlite3.Connection) -> None:
            changed = conn.execute(
                "UPDATE lines SET done = 1, ok = ?, result = ? "
                "WHERE batch_id = ? AND idx = ? AND done = 0",
                (int(ok), json.dumps(result), line.batch_id, line.index),
            ).rowcount
            if changed:
                column = "completed" if ok else "failed"
                conn.execute(f"UPDATE batches SET {column} = {column} + 1 WHERE id = ?",
                             (line.batch_id,))  # fmt: skip

        await self._db.run(update)

    async def set_finalizing(self, batch_id: str) -> None:
        await self._db.run(lambda conn: conn.execute(
            "UPDATE batches SET status = ?, finalizing_at = ? WHERE id = ? AND status = ?",
            (Status.FINALIZING, int(self.clock()), batch_id, Status.IN_PROGRESS),
        ))  # fmt: skip

    async def finish(self, batch_id: str, end: Status, unfinished_code: str | None) -> None:
        """Write the output and error files from the done lines and end the batch as `end`.
        With `unfinished_code`, each line not done gets an error line with that code (as
        OpenAI does for an expired batch)."""
        await self._db.run(lambda conn: self._finish_sync(conn, batch_id, end, unfinished_code))

    def _finish_sync(
        self, conn: sqlite3.Connection, batch_id: str, end: Status, unfinished_code: str | None
    ) -> None:
        rows = conn.execute(
            "SELECT idx, custom_id, done, ok, result FROM lines WHERE batch_id = ? ORDER BY idx",
            (batch_id,),
        ).fetchall()
        output: list[str] = []
        errors: list[str] = []
        for row in rows:
            if row["done"]:
                (output if row["ok"] else errors).append(row["result"])
            elif unfinished_code is not None:
                message = f"the batch ended ({end}) before this request was run"
                errors.append(json.dumps(error_line(row["custom_id"], unfinished_code, message)))
        failed_more = len(errors) - sum(1 for r in rows if r["done"] and not r["ok"])
        output_id = self._write(conn, f"{batch_id}_output.jsonl", output)
        error_id = self._write(conn, f"{batch_id}_error.jsonl", errors)
        conn.execute(
            f"UPDATE batches SET status = ?, {_ENDINGS[end]} = ?, output_file_id = ?, "
            "error_file_id = ?, failed = failed + ? WHERE id = ?",
            (end, int(self.clock()), output_id, error_id, failed_more, batch_id),
        )

    def _write(self, conn: sqlite3.Connection, name: str, lines: list[str]) -> str | None:
        if not lines:
            return None
        content = ("\n".join(lines) + "\n").encode()
        stored = self._files.result_file(name, content)
        self._files.write_sync(conn, stored, content)
        return stored.file_id


def result_line(custom_id: str, status: int, body: bytes) -> dict[str, Any]:
    """An output (or error) file line for a request that got an HTTP answer."""
    try:
        doc: Any = json.loads(body)
    except (ValueError, RecursionError):
        doc = {"error": {"message": body[:500].decode("utf-8", "replace")}}
    request_id = f"req_{uuid.uuid4().hex[:24]}"
    return {
        "id": f"batch_req_{uuid.uuid4().hex[:24]}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": doc},
        "error": None,
    }


def error_line(custom_id: str, code: str, message: str) -> dict[str, Any]:
    """An error file line for a request that got no answer."""
    return {
        "id": f"batch_req_{uuid.uuid4().hex[:24]}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def _get_sync(conn: sqlite3.Connection, batch_id: str) -> dict[str, Any] | None:
    row = conn.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
    return None if row is None else _as_openai(row)


def _as_openai(row: sqlite3.Row) -> dict[str, Any]:
    """The OpenAI `Batch` object of a row."""
    return {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "errors": json.loads(row["errors"]) if row["errors"] else None,
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"],
        "created_at": row["created_at"],
        "in_progress_at": row["in_progress_at"],
        "expires_at": row["expires_at"],
        "finalizing_at": row["finalizing_at"],
        "completed_at": row["completed_at"],
        "failed_at": row["failed_at"],
        "expired_at": row["expired_at"],
        "cancelling_at": row["cancelling_at"],
        "cancelled_at": row["cancelled_at"],
        "request_counts": {
            "total": row["total"],
            "completed": row["completed"],
            "failed": row["failed"],
        },
        "metadata": json.loads(row["metadata"]) if row["metadata"] else None,
    }
