"""The batch scheduler against a real store and a scripted `send`: retries, expiry,
shutdown, and the window it keeps."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servepilot.core.config import BatchConfig
from servepilot.gateway.batch.db import Database
from servepilot.gateway.batch.exchange import Answer
from servepilot.gateway.batch.files import FileStore
from servepilot.gateway.batch.jobs import JobStore, Status
from servepilot.gateway.batch.lines import parse_input
from servepilot.gateway.batch.scheduler import BatchScheduler, FleetRoom
from tests.unit.gateway_support import run

CHAT = "/v1/chat/completions"
OK = Answer(200, b'{"object": "chat.completion"}')


def jsonl(count: int) -> bytes:
    return "".join(
        json.dumps({"custom_id": f"c{i}", "method": "POST", "url": CHAT, "body": {"i": i}}) + "\n"
        for i in range(count)
    ).encode()


class Rig:
    def __init__(self, folder: Path, send: Callable[[str, bytes], Any], **config: Any) -> None:
        self.db = Database(folder / "b.sqlite3")
        self.files = FileStore(self.db, folder / "files")
        self.now = 1000.0
        self.jobs = JobStore(self.db, self.files, clock=lambda: self.now)
        self.slots = 100
        self.interactive = 0
        self.waiting = 0
        self.scheduler = BatchScheduler(self.jobs, send, BatchConfig(**config), self.room)

    def room(self) -> FleetRoom:
        """Every line in flight holds a slot."""
        free = self.slots - self.scheduler.in_flight - self.interactive
        return FleetRoom(self.waiting, 0, free, self.slots)

    async def batch(self, count: int, window_s: int = 3600) -> str:
        lines, errors = parse_input(jsonl(count), CHAT)
        created = await self.jobs.create(CHAT, "file-x", window_s, "1h", None, lines, errors)
        return str(created["id"])

    async def settle(self, steps: int = 50) -> None:
        for _ in range(steps):
            await self.scheduler.step()
            await asyncio.sleep(0.01)

    async def results(self, file_id: str | None) -> list[dict[str, Any]]:
        if file_id is None:
            return []
        stored = await self.files.get(file_id)
        assert stored is not None
        return [json.loads(x) for x in (await self.files.content(stored)).splitlines()]


def test_shed_lines_come_back_without_counting_as_attempts(tmp_path: Path) -> None:
    answers = [Answer(429, b"{}"), Answer(503, b"{}")]

    async def send(path: str, body: bytes) -> Answer:
        return answers.pop(0) if answers else OK

    async def scenario() -> None:
        rig = Rig(tmp_path, send, max_attempts=1)
        batch_id = await rig.batch(3)
        for _ in range(20):
            await rig.scheduler.step()
            await asyncio.sleep(0.01)
            rig.now += 1.0  # past the hold of a shed line
        done = await rig.jobs.get(batch_id)
        assert done is not None and done["status"] == "completed"
        assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        assert [r["custom_id"] for r in await rig.results(done["output_file_id"])] == [
            "c0", "c1", "c2",
        ]  # fmt: skip
        await rig.db.close()

    run(scenario())


def test_a_failing_replica_is_tried_max_attempts_times(tmp_path: Path) -> None:
    sent: list[bytes] = []

    async def send(path: str, body: bytes) -> Answer:
        sent.append(body)
        return Answer(502, b'{"error": {"message": "replica r0 failed", "code": "upstream_error"}}')

    async def scenario() -> None:
        rig = Rig(tmp_path, send, max_attempts=3)
        batch_id = await rig.batch(1)
        await rig.settle()
        done = await rig.jobs.get(batch_id)
        assert done is not None and done["status"] == "completed"
        assert done["request_counts"] == {"total": 1, "completed": 0, "failed": 1}
        assert len(sent) == 3
        [error] = await rig.results(done["error_file_id"])
        assert error["custom_id"] == "c0" and error["response"]["status_code"] == 502
        assert done["output_file_id"] is None
        await rig.db.close()

    run(scenario())


def test_an_expired_batch_ends_with_what_was_done(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def send(path: str, body: bytes) -> Answer:
        if json.loads(body)["i"] >= 2:
            await gate.wait()  # never answered before the deadline
        return OK

    async def scenario() -> None:
        rig = Rig(tmp_path, send, max_concurrency=4)
        batch_id = await rig.batch(5, window_s=60)
        await rig.settle(20)
        rig.now += 61
        await rig.scheduler.step()
        done = await rig.jobs.get(batch_id)
        assert done is not None and done["status"] == Status.EXPIRED
        assert done["expired_at"] is not None
        assert done["request_counts"] == {"total": 5, "completed": 2, "failed": 3}
        assert len(await rig.results(done["output_file_id"])) == 2
        errors = await rig.results(done["error_file_id"])
        assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
            ("c2", "batch_expired"), ("c3", "batch_expired"), ("c4", "batch_expired"),
        ]  # fmt: skip
        assert rig.scheduler.in_flight == 0
        await rig.db.close()

    run(scenario())


def test_stop_leaves_lines_in_flight_pending_for_the_next_start(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def stuck(path: str, body: bytes) -> Answer:
        await gate.wait()
        return OK

    async def ok(path: str, body: bytes) -> Answer:
        return OK

    async def scenario() -> None:
        first = Rig(tmp_path, stuck, max_concurrency=2)
        batch_id = await first.batch(4)
        await first.settle(5)
        assert first.scheduler.in_flight == 1  # the window starts at one line
        await first.scheduler.stop()
        assert first.scheduler.in_flight == 0
        await first.db.close()
        second = Rig(tmp_path, ok)
        await second.settle()
        done = await second.jobs.get(batch_id)
        assert done is not None and done["request_counts"]["completed"] == 4
        await second.db.close()

    run(scenario())


def test_the_window_bounds_lines_in_flight_and_oldest_deadline_goes_first(
    tmp_path: Path,
) -> None:
    seen: list[int] = []
    gate = asyncio.Event()

    async def send(path: str, body: bytes) -> Answer:
        seen.append(json.loads(body)["i"])
        await gate.wait()
        return OK

    async def scenario() -> None:
        rig = Rig(tmp_path, send, max_concurrency=8)
        late = await rig.batch(4, window_s=7200)
        early = await rig.batch(4, window_s=600)
        await rig.settle(5)
        assert rig.scheduler.in_flight == 1  # slow start: one success needed to grow
        gate.set()
        await rig.settle(40)
        for batch_id in (early, late):
            done = await rig.jobs.get(batch_id)
            assert done is not None and done["status"] == "completed"
        early_done = await rig.jobs.get(early)
        late_done = await rig.jobs.get(late)
        assert early_done is not None and late_done is not None
        assert early_done["completed_at"] <= late_done["completed_at"]
        await rig.db.close()

    run(scenario())


def test_lines_leave_the_interactive_reserve_free(tmp_path: Path) -> None:
    gate = asyncio.Event()

    async def send(path: str, body: bytes) -> Answer:
        await gate.wait()
        return OK

    async def scenario() -> None:
        rig = Rig(tmp_path, send, max_concurrency=64, reserve_share=0.2)
        rig.scheduler.window.limit = 32
        await rig.batch(40)
        # 40 slots, 30 held by interactive requests: of the 10 free, 8 (20% of 40) are kept
        # for interactive arrivals, 2 go to the batch.
        rig.slots, rig.interactive = 40, 30
        await rig.settle(5)
        assert rig.scheduler.in_flight == 2
        rig.interactive = 0
        await rig.settle(5)
        assert rig.scheduler.in_flight == 32  # 40 - 8 reserved, and the window is 32
        rig.waiting = 3  # interactive requests queue up at the gateway
        await rig.scheduler.step()
        assert rig.scheduler.window.limit == 16  # halved
        gate.set()
        await rig.settle(20)
        await rig.db.close()

    run(scenario())


def test_fleet_room_known_answers() -> None:
    assert FleetRoom(0, 0, 10, 40).batch_room(0.2) == 2
    assert FleetRoom(0, 3, 10, 40).batch_room(0.2) == -1
    assert FleetRoom(0, 0, 7, 7).batch_room(0.0) == 7


def test_stop_lets_lines_finish_within_the_drain_timeout(tmp_path: Path) -> None:
    async def slow(path: str, body: bytes) -> Answer:
        await asyncio.sleep(0.2 if json.loads(body)["i"] == 0 else 60)
        return OK

    async def scenario() -> None:
        rig = Rig(tmp_path, slow, max_concurrency=2)
        rig.scheduler.window.limit = 2
        batch_id = await rig.batch(2)
        await rig.scheduler.step()
        assert rig.scheduler.in_flight == 2
        started = asyncio.get_running_loop().time()
        await rig.scheduler.stop(drain_timeout_s=1.0)
        # c0 (0.2 s) finished and was committed; c1 (60 s) was cut at the timeout.
        assert 0.9 <= asyncio.get_running_loop().time() - started < 5
        batch = await rig.jobs.get(batch_id)
        assert batch is not None and batch["request_counts"]["completed"] == 1
        pending = await rig.jobs.pending(batch_id, 10, set())
        assert [line.custom_id for line in pending] == ["c1"]
        await rig.db.close()

    run(scenario())


def test_a_line_that_breaks_the_gateway_ends_in_the_error_file(tmp_path: Path) -> None:
    calls: list[int] = []

    async def broken(path: str, body: bytes) -> Answer:
        calls.append(1)
        raise RuntimeError("a bug")

    async def scenario() -> None:
        rig = Rig(tmp_path, broken, max_attempts=2)
        batch_id = await rig.batch(1)
        await rig.settle(20)
        done = await rig.jobs.get(batch_id)
        assert done is not None and done["status"] == "completed" and len(calls) == 2
        [error] = await rig.results(done["error_file_id"])
        assert error["error"] == {
            "code": "internal_error",
            "message": "the gateway failed to run this request: a bug",
        }
        await rig.db.close()

    run(scenario())
