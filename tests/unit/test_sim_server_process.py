"""The simulated replica as a process of its own (`SimProcess`: no GIL shared with the
client): what a client measures on its socket against what the replica model computes for
the same requests (the TTFT and TPOT of one request against the model stepped offline; for
16 overlapping streams the means against the server's own vLLM histograms, the model's times
for exactly those requests), and its lines, serving and draining on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from servepilot.engine.metrics import parse_metrics
from servepilot.engine.simserver.config import SimSetup, build_setup, parse_args
from servepilot.engine.simserver.tokens import ApproxTokenizer
from servepilot.engine.startup_log import parse_kv_capacity
from servepilot.sim import ReplicaModel, SimRequest
from tests.unit.sim_support import BASE_ARGS, COST_FLAGS, chat_body

ROOT = Path(__file__).resolve().parents[2]

# ---- timing --------------------------------------------------------------------------------


class SimProcess:
    """`python -m servepilot.engine.simserver.server` in a process of its own (timing must not
    share a GIL with the client)."""

    def __init__(self, extra: list[str]) -> None:
        argv = [
            sys.executable,
            "-m",
            "servepilot.engine.simserver.server",
            *BASE_ARGS,
            *extra,
            "--port",
            "0",
        ]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.lines: list[str] = []
        assert self.proc.stdout is not None
        while not self.lines or "Starting vLLM API server" not in self.lines[-1]:
            line = self.proc.stdout.readline()
            if not line:
                self.proc.wait(5)
                raise AssertionError("the simulated replica did not start:\n" + "".join(self.lines))
            self.lines.append(line)
        self.url = self.lines[-1].split(" on ")[-1].strip()

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


async def _stream_times(
    url: str, body: dict[str, Any], delay_s: float = 0.0
) -> tuple[float, list[float]]:
    """(send time, arrival time of each content event), by time.perf_counter, over one raw
    HTTP/1.1 connection (no client library between the socket and the clock)."""
    await asyncio.sleep(delay_s)
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    data = json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n")  # fmt: skip
    sent = time.perf_counter()
    writer.write(head.encode() + data)
    arrivals: list[float] = []
    while True:
        chunk = await reader.read(65536)
        now = time.perf_counter()
        arrivals += [now] * (chunk.count(b'"content":"') - chunk.count(b'"content":""'))
        if not chunk or b"[DONE]" in chunk:
            break
    writer.close()
    return sent, arrivals


def _model_times(setup: SimSetup, prompt: int, output: int) -> SimRequest:
    """One request alone on a fresh replica model, stepped back to back."""
    model = ReplicaModel(setup.scheduler, setup.cost)
    request = SimRequest(1, prompt_tokens=prompt, output_tokens=output, arrival_s=0.0)
    model.add(request)
    now = 0.0
    while (result := model.step(now)) is not None:
        now = result.end_s
    return request


def test_a_requests_ttft_and_tpot_through_http_are_the_models() -> None:
    """Five requests one after another (different prompts: no prefix-cache hits), each timed
    by a client on its socket, against the same request stepped through the replica model."""
    setup = build_setup(parse_args([*BASE_ARGS, *COST_FLAGS])[0])
    ttft_errors, tpot_errors = [], []
    with SimProcess(COST_FLAGS) as server:
        for i in range(5):
            body = chat_body(f"{i} words to prefill " * 40, 40, stream=True)
            expected = _model_times(setup, len(ApproxTokenizer().chat(body["messages"])), 40)
            sent, arrivals = asyncio.run(_stream_times(server.url, body))
            assert len(arrivals) == 40 and expected.ttft_s and expected.tpot_s
            ttft_errors.append(arrivals[0] - sent - expected.ttft_s)
            tpot_errors.append((arrivals[-1] - arrivals[0]) / 39 - expected.tpot_s)
    print(f"model TTFT {expected.ttft_s * 1e3:.1f} ms, TPOT {expected.tpot_s * 1e3:.3f} ms; "
          f"HTTP - model: TTFT {[round(e * 1e3, 2) for e in ttft_errors]} ms, "
          f"TPOT {[round(e * 1e3, 3) for e in tpot_errors]} ms")  # fmt: skip
    # Load beside the test (the suite runs four at a time) moves each request's times, so the
    # least-disturbed of the five is the server's own error; a wrong model shows in all five,
    # by a step (20.8 ms here) or more. Quiet, the least TTFT error is about 1 ms; under the
    # suite's load all five have come 3.6 ms late. A first token late shortens the TPOT.
    assert min(abs(e) for e in ttft_errors) < 0.008
    assert min(abs(e) for e in tpot_errors) < 0.0003


def test_overlapping_requests_see_the_models_times() -> None:
    """Sixteen overlapping streams from one client: their mean TTFT, TPOT and E2E against the
    means of the server's vLLM histograms, which hold the model's times for the same
    requests."""
    with SimProcess(COST_FLAGS) as server:

        async def run() -> list[tuple[float, list[float]]]:
            bodies = [chat_body(f"request {i} " * (5 + 7 * i), 30, stream=True) for i in range(16)]
            jobs = (_stream_times(server.url, body, 0.013 * i) for i, body in enumerate(bodies))
            return list(await asyncio.gather(*jobs))

        results = asyncio.run(run())
        snapshot_text = httpx.get(f"{server.url}/metrics").text
    snapshot = parse_metrics(snapshot_text)
    assert snapshot.ttft_seconds.count == 16 and all(len(a) == 30 for _, a in results)
    sums = _sums(snapshot_text)
    client = {
        "ttft": statistics.fmean(a[0] - s for s, a in results),
        "tpot": statistics.fmean((a[-1] - a[0]) / 29 for _, a in results),
        "e2e": statistics.fmean(a[-1] - s for s, a in results),
    }
    model = {
        "ttft": sums["vllm:time_to_first_token_seconds"] / 16,
        "tpot": sums["vllm:request_time_per_output_token_seconds"] / 16,
        "e2e": sums["vllm:e2e_request_latency_seconds"] / 16,
    }
    print({k: f"model {model[k] * 1e3:.2f} ms, HTTP {client[k] * 1e3:.2f} ms" for k in model})
    # The client's extra time is the network and its own event loop (16 sockets read in
    # turn), plus what a loaded two-core host adds: 2-4 ms measured with the other core busy,
    # 10.4 ms with the suite and a benchmark beside it; a wrong clock would cost a whole
    # engine step (38 ms): half of one is the bound.
    assert 0 < client["ttft"] - model["ttft"] < 0.019
    assert abs(client["tpot"] - model["tpot"]) < 0.0003
    assert 0 < client["e2e"] - model["e2e"] < 0.019


def _sums(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                out[sample.name.removesuffix("_sum")] = sample.value
    return out


# ---- the process -----------------------------------------------------------------------------


def test_the_process_prints_vllms_lines_serves_and_drains_on_sigterm() -> None:
    with SimProcess(["--step-ms", "20"]) as server:
        assert parse_kv_capacity("".join(server.lines)) is not None
        with httpx.stream("POST", f"{server.url}/v1/chat/completions",
                          json=chat_body("Hi", 25, stream=True)) as response:  # fmt: skip
            events = response.iter_lines()
            next(events)
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in events if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]" and len(rest) >= 24  # the stream finished
        assert server.proc.wait(10) == 0
        assert server.proc.stdout is not None
        assert "draining: 1 request(s) in flight" in server.proc.stdout.read()
