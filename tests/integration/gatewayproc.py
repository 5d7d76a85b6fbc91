"""Real servers for the gateway's reliability tests, all on 127.0.0.1.

- `StubProcess`: the zero-cost OpenAI streaming stub (tests/support/stub_server.py) in a process
  of its own, so that it can be SIGKILLed; its /metrics also reports how many requests it
  received and the most it had in flight at once (`stub_requests_total`,
  `stub_max_in_flight`), which the gateway's own counters are checked against.
- `GatewayProcess`: `servepilot gateway` run as a user runs it (CLI, fleet.yaml), so that its
  memory is its own and SIGTERM drains it.

The in-process gateway on a thread is threaded_gateway.py's.

Run as a module, it is the stub's entry point:

    python -m tests.integration.gatewayproc stub_server --chunks 16 --delay-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.threaded_gateway import new_loop
from tests.support.stub_server import StubConfig, StubServer, _plain

ROOT = Path(__file__).resolve().parents[2]

STARTUP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, TimeoutError):
        return 0, b""


@contextlib.contextmanager
def simulated_replica(
    folder: Path, model: str, step_ms: float, extra: Sequence[str] = ()
) -> Iterator[str]:
    """A simulated vLLM replica (servepilot/engine/simserver) whose steps take `step_ms`, on a
    free port, logging to `folder`/server.log: its URL once healthy; stopped on exit. `extra`:
    more of its flags."""
    port = free_port()
    with (folder / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "servepilot.engine.simserver.server", "--model", model,
             "--port", str(port), "--max-model-len", "2048", "--step-ms", str(step_ms),
             *extra],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while http_get(f"{url}/health", 1.0)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "no healthy replica"
            time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# --- Prometheus text ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    """Samples of one scrape: `value(name, **labels)` sums the samples matching the labels."""

    samples: tuple[tuple[str, dict[str, str], float], ...]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        rows = tuple(
            (sample.name, dict(sample.labels), float(sample.value))
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        )
        return cls(rows)

    def value(self, name: str, **labels: str) -> float:
        return sum(
            value
            for sample, found, value in self.samples
            if sample == name and all(found.get(k) == v for k, v in labels.items())
        )

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """{label value: summed value} over the samples named `name`."""
        out: dict[str, float] = {}
        for sample, found, value in self.samples:
            if sample == name and label in found:
                out[found[label]] = out.get(found[label], 0.0) + value
        return out

    def has(self, name: str) -> bool:
        return any(sample == name for sample, _, _ in self.samples)


def scrape(base_url: str) -> Metrics:
    status, body = http_get(f"{base_url}/metrics")
    if status != 200:
        raise AssertionError(f"GET {base_url}/metrics answered {status}: {body[:200]!r}")
    return Metrics.parse(body.decode())


# --- the stub ------------------------------------------------------------------------------------


class CountingStub(StubServer):
    """The benchmark stub, with its request count and peak concurrency in its /metrics."""

    def metrics(self) -> bytes:
        _, _, body = super().metrics().partition(b"\r\n\r\n")
        stats = self.stats
        extra = b"stub_requests_total %d\nstub_max_in_flight %d\nstub_in_flight %d\n" % (
            stats.requests,
            stats.max_in_flight,
            stats.in_flight,
        )
        return _plain(b"200 OK", body + extra, b"text/plain; version=0.0.4")


class StubProcess:
    """`CountingStub` in its own process (own session, so a SIGKILL takes only it)."""

    def __init__(self, chunks: int = 16, delay_ms: float = 0.0) -> None:
        self.chunks = chunks
        self.delay_ms = delay_ms
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self) -> StubProcess:
        argv = [sys.executable, "-m", "tests.integration.gatewayproc", "stub_server",
                "--chunks", str(self.chunks), "--delay-ms", str(self.delay_ms)]  # fmt: skip
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, start_new_session=True)
        assert self.proc.stdout is not None
        line = _readline(self.proc.stdout, STARTUP_TIMEOUT_S).decode()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"the stub did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[-1])}"
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def metrics(self) -> Metrics:
        return scrape(self.url)

    def requests(self) -> int:
        return int(self.metrics().value("stub_requests_total"))

    def kill(self) -> None:
        """SIGKILL: no goodbye to anyone, connections reset by the kernel."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def __enter__(self) -> StubProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _readline(stream: IO[bytes], timeout_s: float) -> bytes:
    """One line of a child's stdout, or b"" if none comes in time (the child is stuck)."""
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return box[0] if box else b""


# --- the gateway as a process --------------------------------------------------------------------


class GatewayProcess:
    """`servepilot gateway -c fleet.yaml --replica ... --policy ... --port P` in a process."""

    def __init__(
        self,
        replicas: Sequence[str],
        workdir: Path,
        *,
        policy: str = "round_robin",
        capacity: int | None = None,
        gateway: dict[str, Any] | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.replicas = list(replicas)
        self.extra = list(extra)  # more command-line flags
        self.workdir = workdir
        self.policy = policy
        self.capacity = capacity
        self.settings = gateway or {}
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "gateway.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> GatewayProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        fleet = self.workdir / "fleet.yaml"
        fleet.write_text(yaml.safe_dump({"gateway": self.settings}))
        self.port = free_port()
        argv = [sys.executable, "-m", "servepilot", "gateway", "-c", str(fleet),
                "--policy", self.policy, "--host", "127.0.0.1",
                "--port", str(self.port)]  # fmt: skip
        for url in self.replicas:
            argv += ["--replica", url]
        if self.capacity is not None:
            argv += ["--capacity", str(self.capacity)]
        argv += self.extra
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while http_get(f"{self.url}/ready", 1.0)[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"servepilot gateway did not get ready:\n{self.log()}")
            time.sleep(0.05)
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def metrics(self) -> Metrics:
        return scrape(self.url)

    def settled_metrics(self, timeout_s: float = 5.0) -> Metrics:
        """Its metrics once nothing is in flight or queued any more (a response reaches the
        client a moment before the gateway releases its slot)."""
        deadline = time.monotonic() + timeout_s
        while True:
            metrics = self.metrics()
            busy = metrics.value("servepilot_in_flight_requests") + metrics.value(
                "servepilot_queue_depth"
            )
            if busy == 0 or time.monotonic() > deadline:
                return metrics
            time.sleep(0.05)

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (drain, then exit), SIGKILL after `timeout_s`; the exit code."""
        proc = self.proc
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        return proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> GatewayProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rss_bytes(pid: int) -> int:
    """Resident memory of a live process, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


# --- OpenAI error bodies -----------------------------------------------------------------------


def openai_error(body: bytes) -> dict[str, Any]:
    """The `error` object of an OpenAI-shaped error body; AssertionError if it is not one."""
    try:
        doc = json.loads(body)
    except ValueError:
        raise AssertionError(f"error body is not JSON: {body[:300]!r}") from None
    assert isinstance(doc, dict) and isinstance(doc.get("error"), dict), doc
    error: dict[str, Any] = doc["error"]
    assert isinstance(error.get("message"), str) and error["message"], error
    assert isinstance(error.get("type"), str) and error["type"], error
    assert isinstance(error.get("code"), str) and error["code"], error
    return error


# --- the stub's entry point ---------------------------------------------------------------------


def _main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["stub_server"])
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    config = StubConfig(chunks=args.chunks, chunk_delay_s=args.delay_ms / 1000.0)

    async def serve() -> None:
        server = CountingStub(config)
        port = await server.start("127.0.0.1", 0)
        print(f"listening on {port}", flush=True)
        await asyncio.Event().wait()

    with contextlib.suppress(KeyboardInterrupt), asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(serve())


if __name__ == "__main__":
    _main()
