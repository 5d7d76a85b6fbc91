"""What following a replica's KV events costs the gateway: CPU per published batch (issue 35).

A publisher process (vLLM's own `ZmqEventPublisher`, as a replica runs it) publishes N small
batches (a BlockStored of 4 blocks, every fifth batch a BlockRemoved of 8) at a steady rate;
this process follows them as the gateway does (`KvEventFeeds`: SUB socket, replay probe, the
exact index), and, for reference, with a bare zmq.asyncio SUB socket and a blocking one. CPU is
this process's (its threads, libzmq's I/O thread included) from the first batch to the last,
per batch; the publisher's is not counted. Run each way in turn, alternating, a few times:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/kv_feed_cost.py --batches 2000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PUBLISHER = """
import random, sys, time
from vllm.distributed.kv_events import (BlockRemoved, BlockStored, KVEventBatch,
                                        ZmqEventPublisher)
port, n, rate, size = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
pub = ZmqEventPublisher(data_parallel_rank=0, endpoint=f"tcp://*:{port}",
                        replay_endpoint=f"tcp://*:{port + 1}", buffer_steps=10000)
rng = random.Random(0)
time.sleep(3.0)  # the follower connects and probes
print("go", flush=True)
for i in range(n):
    events = [BlockStored(block_hashes=[rng.getrandbits(63) for _ in range(4)],
                          parent_block_hash=rng.getrandbits(63),
                          token_ids=[rng.randrange(49152) for _ in range(4 * size)],
                          block_size=size,
                          lora_id=None, medium="GPU", lora_name=None)]
    if i % 5 == 0:
        events.append(BlockRemoved(block_hashes=[rng.getrandbits(63) for _ in range(8)],
                                   medium="GPU"))
    pub.publish(KVEventBatch(ts=time.time(), events=events))
    time.sleep(1.0 / rate)
time.sleep(1.0)
pub.shutdown()
"""


BLOCK_SIZE = [16]
"""Tokens a published block holds (`--block-size`): 16 as on most GPUs, 128 on vLLM-CPU."""


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def publisher(port: int, batches: int, rate: float) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", PUBLISHER, str(port), str(batches),
                             str(rate), str(BLOCK_SIZE[0])], stdout=subprocess.PIPE,
                            text=True)  # fmt: skip


async def feed_way(port: int, batches: int, rate: float) -> float:
    from servepilot.gateway.kv_events import KvEventFeeds
    from servepilot.gateway.kv_sources import KvEventsEndpoint
    from servepilot.routing.kv_index import BlockHashing, KvIndex

    proc = publisher(port, batches, rate)
    feeds = KvEventFeeds(KvIndex(BlockHashing(BLOCK_SIZE[0])))
    feeds.subscribe(
        "r0", KvEventsEndpoint(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}")
    )
    feed = feeds.feed("r0")
    assert feed is not None and proc.stdout is not None
    await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)
    # The feed's count is all it shows of its progress: polled, as /metrics would be.
    while feed.batches_applied == 0:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    start_cpu, start = cpu_s(), feed.batches_applied
    until = time.monotonic() + batches / rate + 10
    while feed.batches_applied < batches and time.monotonic() < until:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    per_batch = (cpu_s() - start_cpu) / max(1, feed.batches_applied - start)
    await feeds.close()
    proc.wait()
    return per_batch


async def bare_way(port: int, batches: int, rate: float, blocking: bool) -> float:
    import zmq
    import zmq.asyncio

    proc = publisher(port, batches, rate)
    assert proc.stdout is not None
    if blocking:
        sync = zmq.Context()
        socket = sync.socket(zmq.SUB)
    else:
        context = zmq.asyncio.Context()
        socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(f"tcp://127.0.0.1:{port}")
    await asyncio.get_running_loop().run_in_executor(None, proc.stdout.readline)
    got, start_cpu = 0, 0.0
    while got < batches:
        if blocking:
            socket.recv_multipart()
        else:
            await socket.recv_multipart()  # type: ignore[misc]
        got += 1
        if got == 1:
            start_cpu = cpu_s()
    per_batch = (cpu_s() - start_cpu) / (got - 1)
    socket.close(linger=0)
    proc.wait()
    return per_batch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=100.0, help="batches a second")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--block-size",
        type=int,
        default=16,
        help="tokens a block (a batch stores 4): 16, or vLLM-CPU's 128",
    )
    args = parser.parse_args()
    BLOCK_SIZE[0] = args.block_size
    ways = {
        "gateway's feed": lambda port: feed_way(port, args.batches, args.rate),
        "bare zmq.asyncio": lambda port: bare_way(port, args.batches, args.rate, False),
        "bare blocking": lambda port: bare_way(port, args.batches, args.rate, True),
    }
    results: dict[str, list[float]] = {name: [] for name in ways}
    port = 46300
    for round_ in range(args.rounds):
        for name, way in ways.items():
            port += 2
            results[name].append(asyncio.run(way(port)))
            print(f"round {round_ + 1} {name}: {results[name][-1] * 1e6:.0f} us a batch",
                  flush=True)  # fmt: skip
    print(f"\n{args.batches} batches at {args.rate:g}/s; CPU of the follower per batch, median "
          f"of {args.rounds} (runs)")  # fmt: skip
    for name, values in results.items():
        runs = ", ".join(f"{v * 1e6:.0f}" for v in values)
        print(f"  {name:<18} {statistics.median(values) * 1e6:6.0f} us  ({runs})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
