"""How many tokens the text sent so far is, asked of the replica that continues it.

The relay counts content events, and vLLM sends one per token only while its API server
keeps up with the engine: behind (a loaded CPU), it merges the tokens of several steps into
one event. Lowering max_tokens by the events would then let the answer run past it, and the
usage would undercount. So before a continuation the replica tokenizes the text sent (vLLM's
`/tokenize`), and the larger count wins: where events were merged the text has more tokens
than events, where not the events are exact (a re-tokenization may join two tokens).
"""

from __future__ import annotations

import asyncio
import json
import logging

from servepilot.gateway.replica import Replica
from servepilot.http1.errors import UpstreamFailed

log = logging.getLogger(__name__)

TOKENIZE_TIMEOUT_S = 5.0


class _Answer:
    """A Sink that keeps one whole answer."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0
        self.parts: list[bytes] = []
        self.done: asyncio.Future[bytes] = loop.create_future()

    def on_head(self, status: int, headers: dict[bytes, bytes]) -> None:
        self.status = status

    def on_read(self, data: bytes) -> None:
        if data:
            self.parts.append(data)

    def on_end(self, data: bytes) -> None:
        if not self.done.done():
            self.done.set_result(b"".join([*self.parts, data]))

    def on_failure(self, exc: UpstreamFailed, answered: bool) -> None:
        if not self.done.done():
            self.done.set_exception(exc)


async def tokens_in(replica: Replica, model: str | None, text: str) -> int | None:
    """The tokens of `text` by `replica`'s tokenizer; None when it cannot say."""
    doc: dict[str, object] = {"prompt": text, "add_special_tokens": False}
    if model:
        doc["model"] = model
    body = json.dumps(doc).encode()
    answer = _Answer(asyncio.get_running_loop())
    try:
        conn = replica.upstream.reuse() or await replica.upstream.connect()
    except UpstreamFailed:
        return None
    conn.send(replica.request_head("/tokenize", len(body), b"") + body, answer)
    try:
        raw = await asyncio.wait_for(answer.done, TOKENIZE_TIMEOUT_S)
        count = json.loads(raw).get("count") if answer.status == 200 else None
    except (TimeoutError, UpstreamFailed, ValueError, AttributeError) as exc:
        log.info("replica %s did not count the tokens sent: %s", replica.replica_id, exc)
        conn.abort()
        return None
    finally:
        conn.finish()
    return count if isinstance(count, int) and not isinstance(count, bool) else None
