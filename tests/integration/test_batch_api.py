"""The OpenAI Batch API on the gateway, with the official `openai` client, in front of a
simulated vLLM replica (servepilot/engine/simserver): upload, create, poll, download,
cancel; a kill -9 of the gateway mid-batch and a restart on the same store; bad input."""

from __future__ import annotations

import io
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.integration.fleetproc import wait_until
from tests.integration.gatewayproc import GatewayProcess, simulated_replica

MODEL = "smollm2"


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A simulated replica whose steps take 20 ms: a 16-token answer takes ~0.3 s."""
    with simulated_replica(tmp_path_factory.mktemp("replica"), MODEL, step_ms=20) as url:
        yield url


def batch_settings(folder: Path, **extra: Any) -> dict[str, Any]:
    return {"batch": {"store": f"sqlite:///{folder / 'batch.sqlite3'}",
                      "files_dir": str(folder / "files"), **extra}}  # fmt: skip


def jsonl(count: int, max_tokens: int = 16, prefix: str = "req") -> bytes:
    lines = [
        {"custom_id": f"{prefix}-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": MODEL, "max_tokens": max_tokens,
                  "messages": [{"role": "user", "content": f"question {i}"}]}}
        for i in range(count)
    ]  # fmt: skip
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)


def wait_done(api: openai.OpenAI, batch_id: str, timeout_s: float = 60) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        batch = api.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        assert time.monotonic() < deadline, batch
        time.sleep(0.2)


def output_lines(api: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    text = api.files.content(file_id).text
    return [json.loads(line) for line in text.splitlines()]


def test_upload_create_poll_download(replica: str, tmp_path: Path) -> None:
    with GatewayProcess([replica], tmp_path, gateway=batch_settings(tmp_path)) as gateway:
        api = client(gateway)
        uploaded = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(10))), purpose="batch")
        assert (uploaded.object, uploaded.purpose, uploaded.bytes) == ("file", "batch",
                                                                       len(jsonl(10)))  # fmt: skip
        assert api.files.retrieve(uploaded.id).filename == "in.jsonl"
        assert api.files.content(uploaded.id).content == jsonl(10)
        batch = api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions",
            completion_window="24h", metadata={"team": "search"},
        )  # fmt: skip
        assert batch.status == "in_progress" and batch.metadata == {"team": "search"}
        assert batch.expires_at == batch.created_at + 24 * 3600
        done = wait_done(api, batch.id)
        assert done.status == "completed", done
        assert done.request_counts is not None
        counts = done.request_counts
        assert (counts.total, counts.completed, counts.failed) == (10, 10, 0)
        assert done.error_file_id is None and done.completed_at is not None
        lines = output_lines(api, done.output_file_id)
        assert [line["custom_id"] for line in lines] == [f"req-{i}" for i in range(10)]
        first = lines[0]["response"]
        assert first["status_code"] == 200 and first["body"]["object"] == "chat.completion"
        assert first["body"]["usage"]["completion_tokens"] == 16
        metrics = gateway.metrics()
        assert metrics.value("servepilot_batch_lines_total", outcome="completed") == 10
        assert metrics.value("servepilot_batch_lines_total", outcome="failed") == 0
        assert metrics.value("servepilot_batch_lines_in_flight") == 0
        assert 1 <= metrics.value("servepilot_batch_window") <= 64
        routes = metrics.by_label("servepilot_requests_total", "route")
        assert routes["/v1/batches/{id}"] >= 1 and routes["/v1/files/{id}/content"] == 2
        listed = api.batches.list(limit=5)
        assert [b.id for b in listed.data] == [batch.id]
        assert api.files.retrieve(done.output_file_id).purpose == "batch_output"


def test_cancel_keeps_what_was_done(replica: str, tmp_path: Path) -> None:
    settings = batch_settings(tmp_path, max_concurrency=2)
    with GatewayProcess([replica], tmp_path, gateway=settings) as gateway:
        api = client(gateway)
        uploaded = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(200))), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        assert wait_until(lambda: _completed(api, batch.id) >= 3, 30)
        cancelling = api.batches.cancel(batch.id)
        assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
        done = wait_done(api, batch.id)
        assert done.status == "cancelled" and done.cancelled_at is not None
        assert done.request_counts is not None
        completed = done.request_counts.completed
        assert 3 <= completed < 200
        assert len(output_lines(api, done.output_file_id)) == completed


def _completed(api: openai.OpenAI, batch_id: str) -> int:
    counts = api.batches.retrieve(batch_id).request_counts
    return 0 if counts is None else counts.completed


def test_kill_9_mid_batch_then_restart(replica: str, tmp_path: Path) -> None:
    """Each custom_id once in the output, although the lines in flight at the kill were
    sent again after the restart."""
    settings = batch_settings(tmp_path, max_concurrency=8)
    gateway = GatewayProcess([replica], tmp_path, gateway=settings).start()
    try:
        api = client(gateway)
        uploaded = api.files.create(file=("in.jsonl", io.BytesIO(jsonl(120))), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        assert wait_until(lambda: _completed(api, batch.id) >= 10, 30)
    finally:
        gateway.kill()  # SIGKILL: no drain, no goodbye
    done_before = _counts_in_store(tmp_path)
    assert 10 <= done_before < 120
    with GatewayProcess([replica], tmp_path, gateway=settings) as restarted:
        api = client(restarted)
        done = wait_done(api, batch.id)
        assert done.status == "completed", done
        lines = output_lines(api, done.output_file_id)
        ids = [line["custom_id"] for line in lines]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(120))
        assert len(set(ids)) == len(ids) == 120
        assert done.request_counts is not None and done.request_counts.completed == 120


def _counts_in_store(folder: Path) -> int:
    with sqlite3.connect(folder / "batch.sqlite3") as conn:
        return int(conn.execute("SELECT COUNT(*) FROM lines WHERE done = 1").fetchone()[0])


def test_bad_input(replica: str, tmp_path: Path) -> None:
    settings = batch_settings(tmp_path, max_file_bytes=4096)
    with GatewayProcess([replica], tmp_path, gateway=settings) as gateway:
        api = client(gateway)
        good = jsonl(2).decode().splitlines()
        wrong_url = {"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {}}
        bad = "\n".join([good[0], "{not json", good[0], json.dumps(wrong_url)]) + "\n"
        uploaded = api.files.create(file=("bad.jsonl", io.BytesIO(bad.encode())), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        assert batch.status == "failed" and batch.errors is not None and batch.errors.data
        problems = {(e.code, e.line) for e in batch.errors.data}
        assert problems == {("invalid_json_line", 2), ("duplicate_custom_id", 3),
                            ("invalid_url", 4)}  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="endpoint must be one of"):
            api.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings",
                               completion_window="24h")  # fmt: skip
        with pytest.raises(openai.BadRequestError, match="is not an uploaded batch file"):
            api.batches.create(input_file_id="file-nope", endpoint="/v1/completions",
                               completion_window="24h")  # fmt: skip
        with pytest.raises(
            openai.APIStatusError, match=r"gateway\.batch\.max_file_bytes"
        ) as too_big:
            api.files.create(file=("big.jsonl", io.BytesIO(jsonl(100))), purpose="batch")
        assert too_big.value.status_code == 413
        with pytest.raises(openai.NotFoundError):
            api.batches.retrieve("batch_nope")
        garbage = httpx.post(f"{gateway.url}/v1/files", content=b"x",
                             headers={"content-type": "text/plain"})  # fmt: skip
        assert garbage.status_code == 400 and "multipart/form-data" in garbage.text
        (tmp_path / "files" / f"{uploaded.id}.jsonl").unlink()
        gone = httpx.get(f"{gateway.url}/v1/files/{uploaded.id}/content")
        assert gone.status_code == 404 and "is gone" in gone.text
        wrong = httpx.delete(f"{gateway.url}/v1/batches/{batch.id}")
        assert (wrong.status_code, wrong.headers["allow"]) == (405, "GET")
        assert httpx.get(f"{gateway.url}/v1/batches/{batch.id}/nope").status_code == 404
        assert httpx.get(f"{gateway.url}/v1/batches?limit=0").status_code == 400


def test_model_errors_go_to_the_error_file(replica: str, tmp_path: Path) -> None:
    with GatewayProcess([replica], tmp_path, gateway=batch_settings(tmp_path)) as gateway:
        api = client(gateway)
        lines = jsonl(3).decode().replace(f'"model": "{MODEL}"', '"model": "nope"', 1)
        uploaded = api.files.create(file=("in.jsonl", io.BytesIO(lines.encode())),
                                    purpose="batch")  # fmt: skip
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        done = wait_done(api, batch.id)
        assert done.status == "completed" and done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 1)
        [error] = output_lines(api, done.error_file_id)
        assert error["custom_id"] == "req-0" and error["response"]["status_code"] == 404
        assert error["response"]["body"]["error"]["code"] == "model_not_found"


def test_cli_submit_wait_writes_the_results_beside_the_file(replica: str, tmp_path: Path) -> None:
    with GatewayProcess([replica], tmp_path, gateway=batch_settings(tmp_path)) as gateway:
        source = tmp_path / "questions.jsonl"
        source.write_bytes(jsonl(6))
        done = subprocess.run(
            [sys.executable, "-m", "servepilot", "batch", "submit", str(source),
             "--url", gateway.url, "--wait"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "completed, 6 completed, 0 failed of 6" in done.stderr
        output = tmp_path / "questions.output.jsonl"
        assert f"output: {output}" in done.stdout
        ids = [json.loads(line)["custom_id"] for line in output.read_text().splitlines()]
        assert ids == [f"req-{i}" for i in range(6)]
        refused = subprocess.run(
            [sys.executable, "-m", "servepilot", "batch", "submit", str(source),
             "--url", gateway.url, "--window", "tomorrow"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert refused.returncode == 1
        assert "HTTP 400: completion_window must be like '24h'" in refused.stderr


def test_cli_lists_every_fault_of_each_bad_line_once(replica: str, tmp_path: Path) -> None:
    with GatewayProcess([replica], tmp_path, gateway=batch_settings(tmp_path)) as gateway:
        source = tmp_path / "bad.jsonl"
        several = {"custom_id": "y", "method": "GET", "url": "/v1/embeddings", "body": "text"}
        good = jsonl(1).decode().splitlines()[0]
        source.write_text("\n".join([good, "{not json", json.dumps(several)]) + "\n")
        done = subprocess.run(
            [sys.executable, "-m", "servepilot", "batch", "submit", str(source),
             "--url", gateway.url, "--wait"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: line 2: not valid JSON: Expecting property name enclosed in double quotes at "
        "column 2",
        "error: line 3: method must be POST",
        "error: line 3: url must be the batch's endpoint /v1/chat/completions",
        "error: line 3: body must be a JSON object (the request body)",
    ]
