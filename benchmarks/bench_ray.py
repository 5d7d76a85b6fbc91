"""What the Ray backend costs and how fast it recovers (issue 16), side by side in one run.

overhead: the same simulated replicas behind the gateway of `servepilot up`, local backend
  (child processes) against Ray backend (actors on a Ray cluster `up` starts, address: local).
  The gateway runs in `up` in both; its process is pinned to core 0 and everything it starts
  (replicas; Ray's GCS, raylet and workers) is moved to core 1 with the load generator. Per
  backend: the `up` process's CPU per request (Ray's driver threads included) and the p50/p99
  end-to-end latency it adds over calling a replica directly.
anchor: Ray Serve's own HTTP proxy in front of a streaming stub deployment
  (ray_serve_stub.py) against servepilot's gateway in front of the stub server
  (tests/support/stub_server.py), the same answers with one write per token. Each router
  runs on core 0 (Serve's proxy actor moved there, the rest of Ray on core 1), the same load
  from core 1: the router's CPU per request (the proxy actor's process, from /proc) and the
  latency it adds over the stub called directly.
recovery: simulated replicas spread over a local multi-node Ray cluster
  (tests/support/ray_cluster.py) under a stream of requests; one replica's node is lost
  (tests/support/ray_node_loss.py, the scenario of tests/integration/test_ray_backend.py):
  the time from the loss until the replica serves again on another node, and the requests
  that failed, by whether they had streamed content.

The load is servepilot's bench client (bench_client.py), run as bench_gateway.py runs it.

    python benchmarks/bench_ray.py [--only overhead|anchor|recovery] [--rounds 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from bench_client import pinned, start_stub  # noqa: E402
from bench_gateway import (  # noqa: E402
    LOAD_CORE,
    ROUTER_CORE,
    free_port,
    load,
    servepilot_gateway,
    wait_ready,
)
from bench_routing import stop  # noqa: E402

Row = dict[str, float]
PARTS = ("overhead", "anchor", "recovery")


def descendants(pid: int) -> list[int]:
    """Every live process below `pid` (whichever of its threads started it)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2 :].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def move_to_core(core: str, pids: list[int]) -> None:
    """Pin every thread of each process to `core` (a process that is gone is skipped)."""
    for pid in pids:
        argv = ["taskset", "-a", "-p", "-c", core, str(pid)]
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def added(rows: list[dict[str, Row]], name: str, base: str, metric: str) -> float:
    """The median over rounds of what `name` adds to `base` in `metric`, round by round."""
    return statistics.median(r[name][metric] - r[base][metric] for r in rows)


def med(rows: list[dict[str, Row]], name: str, metric: str) -> float:
    return statistics.median(r[name][metric] for r in rows)


def rounds_table(rows: list[dict[str, Row]], names: dict[str, str]) -> list[str]:
    """One line per router: `names` maps it to the direct baseline it is read against."""
    lines = [f"{'router':<28} {'CPU us/req':>10} {'requests/s':>10} {'+p50 e2e ms':>12} "
             f"{'+p99 e2e ms':>12}   rounds (CPU us/req; +p99 ms)"]  # fmt: skip
    for name, base in names.items():
        cpu = ", ".join(f"{r[name]['cpu_us']:.0f}" for r in rows)
        p99 = ", ".join(f"{r[name]['e2e_p99_ms'] - r[base]['e2e_p99_ms']:.1f}" for r in rows)
        lines.append(
            f"{name:<28} {med(rows, name, 'cpu_us'):>10.0f} {med(rows, name, 'rps'):>10.0f} "
            f"{added(rows, name, base, 'e2e_p50_ms'):>12.2f} "
            f"{added(rows, name, base, 'e2e_p99_ms'):>12.2f}   {cpu}; {p99}"
        )
    failed = sum(r[n]["failed"] for r in rows for n in r)
    if failed:
        lines.append(f"WARNING: {failed:.0f} requests failed")
    return lines


def measure_rounds(
    routers: dict[str, tuple[str, str, int]], args: argparse.Namespace, tmp: Path
) -> list[dict[str, Row]]:
    """`routers`: name -> (its URL, the URL of its direct baseline, the pid whose CPU is its
    own). Each round runs every baseline and router in turn, after one warm-up run each."""
    for url, _, pid in routers.values():
        load(url, args, tmp, pid)
    rows = []
    for index in range(args.rounds):
        started, row = time.perf_counter(), {}
        for name, (url, direct, pid) in routers.items():
            row[f"{name} direct"] = load(direct, args, tmp, None)
            row[name] = load(url, args, tmp, pid)
            if row[name]["failed"] >= args.requests / 2:
                raise SystemExit(f"{name}: {row[name]['failed']:.0f} requests failed (is it down?)")
        rows.append(row)
        cpu = ", ".join(f"{n} {row[n]['cpu_us']:.0f} us/req" for n in routers)
        print(f"  round {index + 1}/{args.rounds} ({time.perf_counter() - started:.0f} s, "
              f"load average {os.getloadavg()[0]:.1f}): {cpu}", flush=True)  # fmt: skip
    return rows


# --- overhead: local backend against Ray backend --------------------------------------------


@dataclass
class Fleet:
    proc: subprocess.Popen[bytes]
    url: str
    replicas: list[str]


def start_fleet(backend: str, args: argparse.Namespace, tmp: Path) -> Fleet:
    """`servepilot up` of 2 simulated replicas on `backend`, its process on ROUTER_CORE and
    all it started on LOAD_CORE, once it serves."""
    from servepilot.fleet.state import record_path

    port = free_port()
    fleet = (f"engine: {{kind: sim, sim_step_ms: {args.step_ms:g}}}\n"
             # The stub's model name: the load generator sends the stub's prompts.
             "model: {source: llama-3.1-8b, served_name: stub-model}\nreplicas: {count: 2}\n"
             f"gateway: {{port: {port}, policy: round_robin}}\n")  # fmt: skip
    if backend == "ray":
        fleet += "cluster: {backend: ray, address: local, placement: pack, local_cpus: 2}\n"
    (tmp / f"{backend}.yaml").write_text(fleet)
    argv = [sys.executable, "-m", "servepilot.cli.main", "up", "-c", str(tmp / f"{backend}.yaml")]
    log = tmp / f"up-{backend}.log"
    with log.open("ab") as sink:
        proc = subprocess.Popen(pinned(ROUTER_CORE, argv), stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/ready", proc, timeout_s=180)
    except SystemExit:
        stop(proc)
        tail = log.read_text()[-3000:]
        raise SystemExit(f"servepilot up ({backend}) did not serve:\n{tail}") from None
    record = json.loads(record_path(port).read_text())
    move_to_core(LOAD_CORE, descendants(proc.pid))
    return Fleet(proc, url, [replica["url"] for replica in record["replicas"]])


def overhead(args: argparse.Namespace, tmp: Path) -> list[str]:
    fleets: dict[str, Fleet] = {}
    try:
        for backend in ("local", "ray"):
            fleets[backend] = start_fleet(backend, args, tmp)
        routers = {f"up, {b} backend": (f.url, f.replicas[0], f.proc.pid)
                   for b, f in fleets.items()}  # fmt: skip
        rows = measure_rounds(routers, args, tmp)
    finally:
        for fleet in fleets.values():
            stop(fleet.proc, 60)
    local, ray = "up, local backend", "up, ray backend"
    lines = [
        f"overhead: {args.requests} requests x {args.chunks} tokens (one per {args.step_ms:g} ms "
        f"step) at concurrency {args.concurrency}; 2 simulated replicas per fleet; the `up` "
        f"process on core {ROUTER_CORE}, replicas, Ray and load on core {LOAD_CORE}; "
        f"median of {len(rows)} rounds",
        *rounds_table(rows, {local: f"{local} direct", ray: f"{ray} direct"}),
        f"ray / local backend: gateway CPU per request "
        f"x{med(rows, ray, 'cpu_us') / med(rows, local, 'cpu_us'):.2f}, added p99 "
        f"{added(rows, ray, f'{ray} direct', 'e2e_p99_ms'):.2f} vs "
        f"{added(rows, local, f'{local} direct', 'e2e_p99_ms'):.2f} ms (target: unchanged)",
    ]
    return lines


# --- anchor: Ray Serve's proxy against servepilot's gateway ---------------------------------


def start_serve(args: argparse.Namespace, tmp: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    """ray_serve_stub.py with Ray on LOAD_CORE, then its proxy actor moved to ROUTER_CORE;
    (the driver, the proxy's URL, the proxy actor's pid)."""
    port = free_port()
    argv = [sys.executable, str(ROOT / "benchmarks" / "ray_serve_stub.py"), "--port", str(port),
            "--chunks", str(args.chunks), "--delay-ms", str(args.delay_ms)]  # fmt: skip
    log = tmp / "serve.log"
    with log.open("ab") as sink:
        proc = subprocess.Popen(pinned(LOAD_CORE, argv), stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while "listening on" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise SystemExit(f"Ray Serve did not start:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)
    wait_ready(url + "/-/healthz", proc)
    proxies = [p for p in descendants(proc.pid) if cmdline(p).startswith("ray::ProxyActor")]
    if len(proxies) != 1:
        stop(proc)
        raise SystemExit(f"expected one Serve proxy actor below the driver, found {proxies}")
    move_to_core(ROUTER_CORE, proxies)
    return proc, url, proxies[0]


def anchor(args: argparse.Namespace, tmp: Path) -> list[str]:
    procs: list[subprocess.Popen[Any]] = []
    try:
        stub, stub_url = start_stub(args.chunks, args.delay_ms, LOAD_CORE)
        procs.append(stub)
        port = free_port()
        gateway = subprocess.Popen(
            pinned(ROUTER_CORE, servepilot_gateway([stub_url], port, args)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        procs.append(gateway)
        gateway_url = f"http://127.0.0.1:{port}"
        wait_ready(gateway_url + "/ready", gateway)
        serve, serve_url, proxy_pid = start_serve(args, tmp)
        procs.append(serve)
        routers = {GATEWAY: (gateway_url, stub_url, gateway.pid),
                   SERVE: (serve_url, stub_url, proxy_pid)}  # fmt: skip
        rows = measure_rounds(routers, args, tmp)
    finally:
        for proc in reversed(procs):
            stop(proc, 60)
    ratio = med(rows, GATEWAY, "cpu_us") / med(rows, SERVE, "cpu_us")
    return [
        f"anchor: {args.requests} requests x {args.chunks} tokens ({args.delay_ms:g} ms apart, "
        f"one write each) at concurrency {args.concurrency}, one stub; each router on core "
        f"{ROUTER_CORE} (Ray Serve: its proxy actor's process), the stub, Serve's replica, the "
        f"rest of Ray and the load on core {LOAD_CORE}; median of {len(rows)} rounds",
        *rounds_table(rows, {GATEWAY: f"{GATEWAY} direct", SERVE: f"{SERVE} direct"}),
        f"servepilot / Ray Serve: CPU per request x{ratio:.2f} (target <= 0.5), added p99 "
        f"{added(rows, GATEWAY, f'{GATEWAY} direct', 'e2e_p99_ms'):.2f} vs "
        f"{added(rows, SERVE, f'{SERVE} direct', 'e2e_p99_ms'):.2f} ms",
    ]


GATEWAY, SERVE = "servepilot gateway", "Ray Serve proxy"


# --- recovery: a node lost under load --------------------------------------------------------


def recovery(args: argparse.Namespace, tmp: Path) -> list[str]:
    from tests.support.ray_cluster import add_worker, sim_fleet, start_cluster
    from tests.support.ray_node_loss import CLIENTS, PROMPT, NodeLoss, node_loss_under_load

    losses: list[NodeLoss] = []
    with contextlib.contextmanager(start_cluster)() as cluster:
        for run in range(args.runs):
            config = sim_fleet(replicas={"count": 3}, model={"source": "llama-3.1-8b"})
            name = f"servepilot-bench-{run}"
            loss = asyncio.run(
                node_loss_under_load(cluster, config, tmp / name, name, after_s=None)
            )
            losses.append(loss)
            add_worker(cluster)  # the next run starts on a cluster of the same shape
            print(f"  run {run + 1}/{args.runs}: {recovery_line(loss)}", flush=True)
    times = [loss.recovery_s for loss in losses]
    before = [failed(loss, streamed=False) for loss in losses]
    return [
        f"recovery: {len(losses)} runs; 3 simulated replicas (5 ms steps, "
        f"{PROMPT['max_tokens']} tokens per answer) spread over a head and 3 nodes of a local "
        f"Ray cluster, {CLIENTS} clients streaming; the node of one replica lost (its server "
        "SIGKILLed, then its raylet removed) 2 s into the load, which ran until the replica "
        "served again",
        *(f"run {i + 1}: {recovery_line(loss)}" for i, loss in enumerate(losses)),
        f"node loss -> serving again on another node: median {statistics.median(times):.1f} s, "
        f"max {max(times):.1f} s; Ray marked the node dead after a median "
        f"{statistics.median(loss.dead_s for loss in losses):.1f} s",
        f"failed before streaming (target 0): {sum(before)} in all; after streaming: "
        f"{sum(failed(loss, streamed=True) for loss in losses)} in all",
    ]


def failed(loss: Any, streamed: bool) -> int:
    return sum(1 for o in loss.outcomes if o.kind != "complete" and o.streamed is streamed)


def recovery_line(loss: Any) -> str:
    done = sum(1 for o in loss.outcomes if o.kind == "complete")
    return (f"{len(loss.outcomes)} requests, {done} completed, failed "
            f"{failed(loss, streamed=True)} after streaming and {failed(loss, streamed=False)} "
            f"before; node dead after {loss.dead_s:.1f} s, serving again "
            f"{loss.recovery_s:.1f} s after the loss")  # fmt: skip


PART: dict[str, Callable[[argparse.Namespace, Path], list[str]]] = {
    "overhead": overhead,
    "anchor": anchor,
    "recovery": recovery,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=PARTS, help="run one part (default: all three)")
    parser.add_argument("--requests", type=int, default=2000, help="per measured run")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--chunks", type=int, default=16, help="streamed tokens per answer")
    parser.add_argument("--rounds", type=int, default=3, help="overhead and anchor")
    parser.add_argument("--step-ms", type=float, default=2.0,
                        help="overhead: the simulated replicas' step (one token each)")  # fmt: skip
    parser.add_argument("--delay-ms", type=float, default=2.0,
                        help="anchor: the stubs' pause before each token")  # fmt: skip
    parser.add_argument("--runs", type=int, default=3, help="recovery: node losses")
    args = parser.parse_args()
    parts = [args.only] if args.only else list(PARTS)
    sections = []
    with tempfile.TemporaryDirectory() as tmp:
        # Fleet records of our own: a `servepilot down --all` run by someone else on this
        # machine must not stop the fleets under test.
        os.environ["SERVEPILOT_STATE"] = str(Path(tmp) / "state")
        for part in parts:
            started = time.perf_counter()
            print(f"{part}:", flush=True)
            lines = PART[part](args, Path(tmp))
            lines[0] += f" ({time.perf_counter() - started:.0f} s)"
            sections.append("\n".join(lines))
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
          f"{os.getloadavg()[0]:.1f}")  # fmt: skip
    print("\n\n".join(sections))


if __name__ == "__main__":
    main()
