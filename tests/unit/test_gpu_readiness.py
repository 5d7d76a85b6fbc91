"""Readiness = /health + a smoke generation that returns tokens: a replica that answers
/health but cannot generate is stopped and reported, naming it and its log."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from servepilot.core.errors import EngineStartError
from servepilot.engine.args import LaunchCommand
from servepilot.engine.ports import free_port
from servepilot.engine.process import ReplicaProcess
from servepilot.engine.smoke import SMOKE_MAX_TOKENS, SmokeFailure, smoke_generation
from tests.unit.fake_upstream import FakeUpstream


async def smoke(upstream: FakeUpstream, timeout_s: float = 5.0) -> int:
    await upstream.start()
    try:
        return (await smoke_generation(upstream.url, timeout_s)).completion_tokens
    finally:
        await upstream.stop()


def test_a_replica_that_generates_passes() -> None:
    upstream = FakeUpstream("r0", models=("llama",))
    upstream.usage = {"prompt_tokens": 1, "completion_tokens": 2}
    assert asyncio.run(smoke(upstream)) == 2
    (sent,) = upstream.received
    assert sent["model"] == "llama" and sent["max_tokens"] == SMOKE_MAX_TOKENS == 2


def test_no_tokens_fails() -> None:
    upstream = FakeUpstream("r0")
    upstream.usage = {"prompt_tokens": 1, "completion_tokens": 0}
    with pytest.raises(SmokeFailure, match="returned no tokens"):
        asyncio.run(smoke(upstream))


def test_an_error_status_fails() -> None:
    upstream = FakeUpstream("r0")
    upstream.reply_status = 500
    with pytest.raises(SmokeFailure, match="answered 500"):
        asyncio.run(smoke(upstream))


def test_a_generation_that_hangs_times_out() -> None:
    upstream = FakeUpstream("r0")
    upstream.reply_delay_s = 5.0
    with pytest.raises(SmokeFailure, match="no answer within 0 s"):
        asyncio.run(smoke(upstream, timeout_s=0.3))


# Healthy, lists a model, but every completion fails (as an engine whose model did not load).
_BROKEN_SERVER = textwrap.dedent(
    """
    import json, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer
    class H(BaseHTTPRequestHandler):
        def _send(self, code, body):
            self.send_response(code); self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        def do_GET(self):
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self._send(200, body if self.path == "/v1/models" else b"")
        def do_POST(self):
            self._send(500, b"CUDA error: an illegal memory access was encountered")
        def log_message(self, *args):
            pass
    print("engine started", flush=True)
    HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)


def test_a_healthy_replica_that_cannot_generate_is_not_ready(tmp_path: Path) -> None:
    port = free_port()
    command = LaunchCommand((sys.executable, "-c", _BROKEN_SERVER, str(port)), {})
    log = tmp_path / "r3.log"
    proc = ReplicaProcess("r3", command, f"http://127.0.0.1:{port}", log)
    proc.start()
    try:
        with pytest.raises(EngineStartError) as caught:
            asyncio.run(proc.wait_ready(30))
    finally:
        proc.stop(1)
    text = str(caught.value)
    assert text.startswith(f"replica r3 (http://127.0.0.1:{port}) answered /health but its smoke")
    assert "answered 500: CUDA error" in text and f"full log: {log}" in text
    assert "the server runs but the model does not generate" in text
    assert proc.exit_code() is not None  # stopped, never put into rotation
