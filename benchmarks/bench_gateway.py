"""What servepilot's gateway costs per request, next to vllm-router (Rust), on one core.

Two zero-cost streaming stubs (tests/support/stub_server.py) are the replicas. Each router in
turn runs pinned to core 0 with the same policy kind (round_robin) in front of the same stubs;
the load generator (servepilot's bench client) and the stubs share core 1. Every round also
measures the stubs called directly, so the latency a router adds is read against the same
machine state.

servepilot's gateway runs twice per round, without and with its access log (every request
logged to a file in the run's temporary folder), so that the log's cost is read side by side.
Twice more, its /metrics scraped every --scrape-s seconds during the run: without and with the
scrape-time gauges a fleet.yaml turns on (batch utilisation, cost per QPS), so that their cost
is read side by side too (the scrapes' CPU is the gateway's).

Reported per router: its CPU time per proxied request (user + system from /proc, over the
measured run only; summed over its worker processes), requests/s, and the p50/p99 end-to-end
latency it adds over calling a stub directly. Rounds alternate; the table shows medians.

Then the everyday point (gateway_everyday.py): servepilot's gateway and vllm-router at about
1,000 requests/s, 16 in flight, an aiohttp client, stubs that write each token alone (as vLLM
does); `--point saturation|everyday` runs one of the two.

    python benchmarks/bench_gateway.py [--requests 20000] [--concurrency 32] [--rounds 3]

servepilot's gateway runs compiled where `make gateway-fast` has built its data path for the
current sources (`make bench-gateway` builds it first; the first line printed says which, as
core/accel.py decides); SERVEPILOT_GATEWAY_PURE=1 measures it in pure Python. Run from the
checkout to measure: the gateway starts with `python -m`, which imports from the current
folder first.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import gateway_everyday
from bench_client import SP_END, SP_START, cpu_s, pinned, run_child, start_stub

from servepilot.core import accel

ROUTER_CORE, LOAD_CORE = "0", "1"
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tree_cpu_s(pid: int) -> float | None:
    """CPU seconds of `pid` and its descendants (a multi-process router counts whole)."""
    total, seen = 0.0, [pid]
    while seen:
        current = seen.pop()
        own = cpu_s(current)
        if own is None:
            if current == pid:
                return None
            continue
        total += own
        try:
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except OSError:
            children = []
        seen.extend(int(c) for c in children)
    return total


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> None:
    """Until `url` answers 200 (the router sees a healthy replica)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} was not ready within {timeout_s:.0f} s")


def servepilot_gateway(stubs: list[str], port: int, args: argparse.Namespace) -> list[str]:
    argv = [sys.executable, "-m", "servepilot.cli.main", "gateway", "--port", str(port),
            "--policy", "round_robin"]  # fmt: skip
    for url in stubs:
        argv += ["--replica", url]
    return argv


def servepilot_gateway_logged(stubs: list[str], port: int, args: argparse.Namespace) -> list[str]:
    return [*servepilot_gateway(stubs, port, args), "--access-log", str(args.access_log)]


def servepilot_gateway_gauges(stubs: list[str], port: int, args: argparse.Namespace) -> list[str]:
    return [*servepilot_gateway(stubs, port, args), "-c", str(args.fleet_yaml)]


def vllm_router(stubs: list[str], port: int, args: argparse.Namespace) -> list[str]:
    exe = shutil.which("vllm-router", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("vllm-router is not installed: pip install vllm-router")
    return [exe, "--worker-urls", *stubs, "--policy", "round_robin", "--host", "127.0.0.1",
            "--port", str(port), "--log-level", "warning",
            "--prometheus-port", str(free_port())]  # fmt: skip


ROUTERS: dict[str, tuple[Callable[[list[str], int, argparse.Namespace], list[str]], str]] = {
    "servepilot gateway": (servepilot_gateway, "/ready"),
    "servepilot + access log": (servepilot_gateway_logged, "/ready"),
    "servepilot, scraped": (servepilot_gateway, "/ready"),
    "servepilot + gauges, scraped": (servepilot_gateway_gauges, "/ready"),
    "vllm-router": (vllm_router, "/health"),
}
ALL_ROUTERS = dict(ROUTERS)
"""Every router, whatever --only leaves in ROUTERS (the saturation point's)."""
SCRAPED = {"servepilot, scraped", "servepilot + gauges, scraped"}


class Scraper:
    """GET /metrics every `interval_s` in a thread, as Prometheus would, while a run lasts."""

    def __init__(self, url: str, interval_s: float) -> None:
        self._url, self._interval_s = url + "/metrics", interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.scrapes = self.failures = 0

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                with urllib.request.urlopen(self._url, timeout=30) as answer:
                    answer.read()
                self.scrapes += 1
            except OSError:  # an overloaded machine: a missed scrape, as Prometheus has
                self.failures += 1


def scrape_cost_us(replicas: int, scrapes: int = 2000) -> tuple[float, float]:
    """CPU microseconds of one /metrics render without and with the gauges (in this process,
    interleaved, median of blocks): the gauges' whole cost, since they run only at scrape."""
    from servepilot.core.config import GatewayConfig
    from servepilot.gateway import FleetFacts, ReplicaInfo
    from servepilot.gateway.metrics import GatewayMetrics
    from servepilot.routing import make_policy

    infos = [ReplicaInfo(f"r{i}", f"http://127.0.0.1:{9000 + i}", True, False, 3, 0, 5, 2, 0.4,
                         ("m",), 64, None) for i in range(replicas)]  # fmt: skip

    class Pool:
        def replicas(self) -> list[ReplicaInfo]:
            return infos

    config = GatewayConfig()
    policy = make_policy(config.policy, config.routing, 0)
    plain, gauged = GatewayMetrics(Pool(), policy), GatewayMetrics(Pool(), policy)  # type: ignore[arg-type]
    gauged.know_fleet(FleetFacts(max_num_seqs=128, replica_usd_per_hour=0.1))
    for m in (plain, gauged):
        latency = m.route_latency("/v1/chat/completions")
        for i in range(replicas):
            m.count_request("/v1/chat/completions", 200)
            latency.observe(i % 3, 0.05, 0.5)
    blocks: dict[int, list[float]] = {0: [], 1: []}
    for _ in range(20):
        for key, m in enumerate((plain, gauged)):
            started = time.process_time()
            for _ in range(scrapes // 20):
                m.render()
            blocks[key].append((time.process_time() - started) / (scrapes // 20) * 1e6)
    return statistics.median(blocks[0]), statistics.median(blocks[1])


def load(url: str, args: argparse.Namespace, tmp: Path, probe_pid: int | None) -> dict[str, float]:
    """One measured run of the load generator on LOAD_CORE against `url`."""
    out = tmp / "load.json"
    out.unlink(missing_ok=True)
    argv = [sys.executable, str(ROOT / "benchmarks" / "bench_client.py"), "--servepilot-run",
            url, "--out", str(out), "--model", "stub-model", "--requests", str(args.requests),
            "--concurrency", str(args.concurrency), "--chunks", str(args.chunks)]  # fmt: skip
    result, cpu = run_child(argv, LOAD_CORE, out, SP_START, SP_END, probe_pid)
    if probe_pid is not None:
        result["cpu_us"] = cpu / args.requests * 1e6
    return result


def one_round(
    stubs: list[str], args: argparse.Namespace, tmp: Path, index: int
) -> dict[str, dict[str, float]]:
    rows = {"direct": load(stubs[0], args, tmp, None)}
    # Every other round in reverse order: a machine that gets busier during a round would
    # otherwise always charge the same router.
    order = list(ROUTERS)
    for name in order[::-1] if index % 2 else order:
        proc, url = start_router(name, stubs, args)
        try:
            scraping = Scraper(url, args.scrape_s) if name in SCRAPED else contextlib.nullcontext()
            with scraping:
                load(url, args, tmp, proc.pid)  # warm-up: connection pools, caches
                rows[name] = load(url, args, tmp, proc.pid)
        finally:
            stop_router(proc)
    return rows


def start_router(
    name: str, stubs: list[str], args: argparse.Namespace
) -> tuple[subprocess.Popen[bytes], str]:
    """Router `name` on ROUTER_CORE in front of `stubs`, ready; (its process, its URL)."""
    command, ready_path = ALL_ROUTERS[name]
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RUST_LOG": "warn"}
    proc = subprocess.Popen(pinned(ROUTER_CORE, command(stubs, port, args)), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + ready_path, proc)
    except BaseException:
        stop_router(proc)
        raise
    return proc, url


def stop_router(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def table(rounds: list[dict[str, dict[str, float]]], args: argparse.Namespace) -> str:
    def med(name: str, metric: str) -> float:
        return statistics.median(r[name][metric] for r in rounds)

    lines = [
        f"{args.requests} requests x {args.chunks} streamed tokens "
        f"({f'{args.delay_ms:g} ms apart' if args.delay_ms else 'in one write'}) at concurrency "
        f"{args.concurrency}, 2 stub replicas; routers on core {ROUTER_CORE}, load + stubs on "
        f"core {LOAD_CORE}; median of {len(rounds)} rounds",
        f"{'router':<24} {'CPU us/req':>10} {'requests/s':>10} {'+p50 e2e ms':>12} "
        f"{'+p99 e2e ms':>12}   rounds (CPU us/req)",
    ]
    for name in ROUTERS:
        each = ", ".join(f"{r[name]['cpu_us']:.0f}" for r in rounds)
        added50 = med(name, "e2e_p50_ms") - med("direct", "e2e_p50_ms")
        added99 = med(name, "e2e_p99_ms") - med("direct", "e2e_p99_ms")
        lines.append(f"{name:<24} {med(name, 'cpu_us'):>10.0f} {med(name, 'rps'):>10.0f} "
                     f"{added50:>12.2f} {added99:>12.2f}   {each}")  # fmt: skip
    d = rounds and statistics.median(r["direct"]["rps"] for r in rounds)
    lines.append(f"{'direct (no router)':<24} {d:>21.0f}")
    ours, logged, theirs = "servepilot gateway", "servepilot + access log", "vllm-router"
    if ours in ROUTERS and theirs in ROUTERS:
        cpu_ratio = med(ours, "cpu_us") / med(theirs, "cpu_us")
        lines.append(
            f"servepilot / vllm-router: CPU per request x{cpu_ratio:.2f} (target <= 1), added "
            f"p99 {med(ours, 'e2e_p99_ms') - med('direct', 'e2e_p99_ms'):.2f} vs "
            f"{med(theirs, 'e2e_p99_ms') - med('direct', 'e2e_p99_ms'):.2f} ms (target: no worse)"
        )
    if ours in ROUTERS and logged in ROUTERS:
        # Per round, then the median: the two runs of a round share the machine's state.
        extra = statistics.median(r[logged]["cpu_us"] - r[ours]["cpu_us"] for r in rounds)
        lines.append(
            f"access log on vs off: {extra:+.0f} us CPU per request "
            f"({extra / med(ours, 'cpu_us'):+.0%}; median of the rounds' differences)"
        )
    plain, gauged = "servepilot, scraped", "servepilot + gauges, scraped"
    if plain in ROUTERS and gauged in ROUTERS:
        extra = statistics.median(r[gauged]["cpu_us"] - r[plain]["cpu_us"] for r in rounds)
        lines.append(
            f"gauges on vs off, /metrics scraped every {args.scrape_s:g} s: {extra:+.1f} us CPU "
            f"per request ({extra / med(plain, 'cpu_us'):+.1%}; median of the rounds' "
            "differences; target <= +5%)"
        )
    failed = sum(r[name]["failed"] for r in rounds for name in r)
    if failed:
        lines.append(f"WARNING: {failed:.0f} requests failed")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=16, help="streamed tokens per answer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--delay-ms", type=float, default=0.0,
        help="stub pause before each token (0: the whole answer in one write)",
    )  # fmt: skip
    parser.add_argument("--scrape-s", type=float, default=1.0,
                        help="seconds between /metrics scrapes of the scraped runs")  # fmt: skip
    parser.add_argument("--scrape-replicas", type=int, default=16,
                        help="replicas in the in-process scrape-cost measurement")  # fmt: skip
    parser.add_argument(
        "--only", choices=sorted(ROUTERS), action="append",
        help="measure only this router (repeat for several)",
    )  # fmt: skip
    parser.add_argument(
        "--point", choices=("saturation", "everyday", "both"), default="both",
        help="saturation (closed loop, whole answers), everyday (1,000 requests/s paced, "
        "a write per token, aiohttp), or both",
    )  # fmt: skip
    gateway_everyday.add_arguments(parser)
    args = parser.parse_args()
    print(f"servepilot gateway data path: {accel.status(accel.GATEWAY)}", flush=True)
    if args.only:
        for name in list(ROUTERS):
            if name not in args.only:
                del ROUTERS[name]
    if args.point in ("saturation", "both"):
        saturation(args)
    if args.point in ("everyday", "both"):
        everyday(args)


def saturation(args: argparse.Namespace) -> None:
    stubs = [start_stub(args.chunks, args.delay_ms, LOAD_CORE) for _ in range(2)]
    rounds = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            args.access_log = Path(tmp) / "access.log"
            # What turns the gauges on: the batch size and the price (the catalog's CPU host).
            args.fleet_yaml = Path(tmp) / "fleet.yaml"
            args.fleet_yaml.write_text("engine: {max_num_seqs: 128}\n")
            for index in range(args.rounds):
                started = time.perf_counter()
                rows = one_round([url for _, url in stubs], args, Path(tmp), index)
                rounds.append(rows)
                cpu = ", ".join(f"{n} {rows[n]['cpu_us']:.0f} us/req" for n in ROUTERS)
                print(f"round {index + 1}/{args.rounds} ({time.perf_counter() - started:.0f} s, "
                      f"load average {os.getloadavg()[0]:.1f}): {cpu}", flush=True)  # fmt: skip
    finally:
        for proc, _ in stubs:
            proc.terminate()
            proc.wait(10)
    print(table(rounds, args))
    without, with_gauges = scrape_cost_us(args.scrape_replicas)
    print(
        f"one /metrics scrape with {args.scrape_replicas} replicas: {without:.0f} us CPU, "
        f"{with_gauges:.0f} us with the gauges ({with_gauges - without:+.0f} us a scrape)"
    )


def everyday(args: argparse.Namespace) -> None:
    """The everyday point (gateway_everyday.py): per-token writes, a paced load, aiohttp."""
    args.load_core = LOAD_CORE
    stubs = [start_stub(args.chunks, args.everyday_delay_ms, LOAD_CORE) for _ in range(2)]
    urls = [url for _, url in stubs]
    rounds = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for index in range(args.rounds):
                started = time.perf_counter()
                rows = gateway_everyday.one_round(
                    urls, args, Path(tmp), index,
                    lambda name: start_router(name, urls, args), stop_router,
                )  # fmt: skip
                rounds.append(rows)
                cpu = ", ".join(f"{n} {rows[n]['cpu_us']:.0f} us/req"
                                for n in gateway_everyday.ROUTER_NAMES)  # fmt: skip
                took_s = time.perf_counter() - started
                print(f"everyday round {index + 1}/{args.rounds} ({took_s:.0f} s, load average "
                      f"{os.getloadavg()[0]:.1f}): {cpu}", flush=True)  # fmt: skip
    finally:
        for proc, _ in stubs:
            proc.terminate()
            proc.wait(10)
    print(gateway_everyday.table(rounds, args))


if __name__ == "__main__":
    main()
