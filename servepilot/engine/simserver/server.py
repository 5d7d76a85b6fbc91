"""A simulated vLLM replica: vLLM's HTTP API and metric names, timed in real time by the
replica model, so a gateway can be tested against dozens of replicas on one machine.

    python -m servepilot.engine.simserver.server --model smollm2 --port 8001 \\
        --kv-cache-memory-bytes 2147483648 --max-model-len 2048 [--profile PROFILE.json]

It takes vLLM's server flags (those servepilot passes; others are ignored with a warning)
plus the simulator's own (`--accelerator`, `--profile`, `--step-ms`, `--cost`,
`--tokenizer`; see `--help` and config.py). At startup it prints what vLLM prints
once its KV cache is allocated:

    GPU KV cache size: 93,184 tokens, Maximum concurrency for 2,048 tokens per request: 45.50x

(engine/startup_log.py reads it), then serves. SIGTERM or SIGINT drains: no new
connections, requests in flight finish (up to --drain-timeout-s), then it exits. With
`--kv-events-config` it publishes its KV cache events as vLLM does (kvpublisher.py), its
sockets bound before it serves and closed after its engine stops.

Modules: config (flags -> scheduler, KV blocks, cost model), realtime (the step loop), app
(routes), sinks (tokens -> the HTTP answer), openai_api (request checks, response bytes),
metrics (/metrics), tokens (token counts), prefixmap (prefix-cache groups), kvconfig and
kvpublisher (KV events); the HTTP/1.1 server is servepilot.http1's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import time

import zmq

from servepilot.core.errors import ServepilotError
from servepilot.engine.args import SLEEP_ENDPOINTS_ENV
from servepilot.engine.simserver.app import SimApp
from servepilot.engine.simserver.config import SimSetup, build_setup, parse_args
from servepilot.engine.simserver.kvpublisher import KvEventPublisher
from servepilot.engine.simserver.realtime import RealtimeEngine
from servepilot.engine.simserver.sleep import sleep_times
from servepilot.engine.simserver.tokens import PromptTokenizer, load_tokenizer
from servepilot.plan.costmodel import COEFFICIENTS
from servepilot.routing.kv_index import DEFAULT_SEED
from servepilot.sim.engine.replica import ReplicaModel

log = logging.getLogger("servepilot.engine.simserver.server")


def _print(message: str) -> None:
    # vLLM's log line shape, so a replica log reads the same whichever engine wrote it.
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"INFO {stamp} [sim] {message}", flush=True)


def startup_lines(setup: SimSetup) -> list[str]:
    s = setup.scheduler
    cost = setup.cost
    return [
        f"simulated replica of {setup.spec.name} (served as {setup.served_name!r})",
        f"scheduler: max_num_seqs={s.max_num_seqs}, max_num_batched_tokens="
        f"{s.max_num_batched_tokens}, max_model_len={s.max_model_len}, block_size="
        f"{s.block_size}, num_blocks={s.num_blocks}, chunked_prefill="
        f"{s.enable_chunked_prefill}, prefix_caching={s.enable_prefix_caching}, "
        f"async_scheduling={s.async_scheduling}",
        f"cost model ({cost.source}): "
        + ", ".join(f"{n}={v:.3g}" for n, v in zip(COEFFICIENTS, cost.coefficients, strict=True)),
        f"{setup.device_label} KV cache size: {setup.kv_capacity_tokens:,} tokens, Maximum "
        f"concurrency for {s.max_model_len:,} tokens per request: {setup.max_concurrency:.2f}x",
    ]


async def serve(app: SimApp, host: str, port: int, drain_s: float) -> bool:
    """Serve until SIGTERM or SIGINT, then drain; False if the engine loop failed (a bug:
    the process then exits with an error, so the fleet sees the replica die)."""
    server = app.http_server()
    engine_task = app.engine.start()
    bound = await server.start(host, port)
    _print(f"Starting vLLM API server on http://{host}:{bound}")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stop_task = asyncio.ensure_future(stop.wait())
    await asyncio.wait({stop_task, engine_task}, return_when=asyncio.FIRST_COMPLETED)
    if engine_task.done():
        stop_task.cancel()
        await server.close()
        log.error("the engine loop stopped: %r", engine_task.exception())
        return False
    _print(f"draining: {app.engine.in_flight} request(s) in flight")
    app.draining = True
    server.stop_listening()
    with contextlib.suppress(TimeoutError):
        # Until every answer is written, not only generated: a slow client's is held back.
        await asyncio.wait_for(server.wait_idle(), drain_s)
    # Bounded: a connection that never closes must not keep the process alive.
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.close(), 5.0)
    await app.engine.close()
    _print("stopped")
    return True


def sim_app(
    setup: SimSetup,
    args: argparse.Namespace,
    tokenizer: PromptTokenizer,
    publisher: KvEventPublisher | None,
) -> SimApp:
    """The replica's engine and routes; its KV events go to `publisher`, if any."""
    engine = RealtimeEngine(
        ReplicaModel(setup.scheduler, setup.cost),
        # vLLM seeds its first block's hash with PYTHONHASHSEED when it is set.
        hash_seed=os.environ.get("PYTHONHASHSEED", DEFAULT_SEED),
        kv_events=publisher,
    )
    return SimApp(
        engine,
        tokenizer,
        served_name=setup.served_name,
        max_model_len=setup.scheduler.max_model_len,
        sleep=sleep_times(args),
        drop_streams_after_tokens=args.drop_streams_after_tokens,
        kv_event_sources=None if publisher is None else publisher.config.sources(),
        dev_routes=os.environ.get(SLEEP_ENDPOINTS_ENV) == "1",
    )


async def _run(args: argparse.Namespace, setup: SimSetup, tokenizer: PromptTokenizer) -> bool:
    """Publish (bound before serving), serve, then close the publisher after the engine."""
    events = setup.kv_events
    publisher = KvEventPublisher.start(events) if events.publishes else None
    try:
        app = sim_app(setup, args, tokenizer, publisher)
        if publisher is not None:
            bound = publisher.config
            _print(f"KV events on {bound.endpoint}, replay on {bound.replay_endpoint}")
        return await serve(app, args.host, args.port, args.drain_timeout_s)
    finally:
        if publisher is not None:
            await publisher.close()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args, ignored = parse_args(sys.argv[1:] if argv is None else argv)
    if ignored:
        _print(f"ignored (no effect on the simulation): {' '.join(ignored)}")
    try:
        setup = build_setup(args)
        tokenizer = load_tokenizer(args.tokenizer)
    except ServepilotError as exc:
        print(f"ValueError: {exc}", file=sys.stderr, flush=True)
        return 1
    for line in startup_lines(setup):
        _print(line)
    _print(f"tokenizer: {tokenizer.name}")

    try:
        ok = asyncio.run(_run(args, setup, tokenizer))
    except OSError as exc:  # the port is taken: vLLM's wording, which startup_log diagnoses
        print(f"OSError: [Errno {exc.errno}] {exc.strerror}", file=sys.stderr, flush=True)
        return 1
    except zmq.ZMQError as exc:  # a KV events endpoint taken or malformed
        print(f"zmq.error.ZMQError: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
