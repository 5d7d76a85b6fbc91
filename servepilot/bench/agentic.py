"""Sends the agentic workload (`load.agentic`) as a chat client does: each turn carries the
whole conversation so far, the answers as the server gave them, so a turn goes out only after
the previous answer arrived (and the turn's wait: `load.sessions`).

Texts are cut before the level (the tokenizer may be the server's, over HTTP): the shared
system prompts, and pools of user messages and tool results, each sized so that the server
counts what the workload asks (the chat template's tokens off each message). A session's
first message starts with its session id (a few tokens more than asked), so two sessions
never share more than their system prompt. Tool results go as user messages: a `tool`
message needs an assistant `tool_calls` before it, which a generated answer does not have.
On completions the prompt is the texts joined. Every request carries its session in
X-Session-Id.

One client process runs the level: its sessions depend on their answers, not on a schedule
that processes could share out in advance.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import time
from dataclasses import dataclass

from servepilot.bench.client import Client, Target
from servepilot.bench.drive import PROGRESS_EVERY_S, ProgressFn, Tally, raise_fd_limit, until_end
from servepilot.bench.prompts import PromptMaker
from servepilot.bench.records import Endpoint, RequestSpec
from servepilot.bench.runner import LoadInterrupted, LoadOutcome, outcome
from servepilot.bench.tokenizer import Tokenizer
from servepilot.bench.workers import PRECONNECT_MAX
from servepilot.core.errors import ConfigError
from servepilot.core.loop import cancel_and_wait
from servepilot.load.loadplan import LoadPlan
from servepilot.load.sessions import SessionLoop, SessionScript, TurnSlot
from servepilot.load.slots import send_times
from servepilot.load.workload import WorkloadSpec

POOL = 16
"""Texts of each kind (user message, tool result) that sessions take turns with."""


@dataclass(frozen=True, slots=True)
class AgenticTexts:
    system: tuple[str, ...]
    user: tuple[str, ...]
    tool: tuple[str, ...]

    def message(self, script: SessionScript, turn: int) -> str:
        pool = self.tool if script.turns[turn].tool else self.user
        text = pool[(script.session * len(script.turns) + turn) % len(pool)]
        return f"[{script.session_id}] {text}" if turn == 0 else text


def make_texts(
    spec: WorkloadSpec, tokenizer: Tokenizer, *, chat_template_tokens: int = 0
) -> AgenticTexts:
    """The level's texts. On chat (`chat_template_tokens` > 0: what the template adds to a
    one-message request) each is shorter by what the template adds to that message inside a
    conversation (`_message_overheads`), so the server counts the workload's sizes."""
    agentic = spec.agentic
    system_over, user_over = _message_overheads(tokenizer, chat_template_tokens)
    sizes = {
        "--system-prompt-tokens": (agentic.system_prompt_tokens, system_over),
        "--input-tokens": (spec.input_tokens, user_over),
        "--tool-tokens": (agentic.tool_tokens, user_over),
    }
    for flag, (tokens, over) in sizes.items():
        if tokens <= over:
            raise ConfigError(
                f"{flag} ({tokens}) leaves no room for a message: the chat template takes "
                f"{over} tokens of it",
                hint=f"raise {flag}, or send --endpoint completions (no template)",
            )
    system, user, tool = (tokens - over for tokens, over in sizes.values())
    maker = PromptMaker(tokenizer, seed=spec.seed)
    rng = random.Random(f"{spec.seed}/prompts")
    texts = maker.make_prompts([system] * agentic.system_prompts + [user, tool] * POOL, rng)
    rest = texts[agentic.system_prompts :]
    return AgenticTexts(tuple(texts[: agentic.system_prompts]), tuple(rest[::2]),
                        tuple(rest[1::2]))  # fmt: skip


_PROBE = ("The system says this.", "The user says that.")


def _message_overheads(tokenizer: Tokenizer, chat_template_tokens: int) -> tuple[int, int]:
    """(system, user) message: what the template adds to each. The system message carries the
    generation prompt; a later message only its role markers. A template may add a default
    system prompt to a request without one (SmolLM2's does), which the one-message figure
    includes and a conversation with its own system prompt does not. Without the template
    (a server tokenizer that cannot render it) the one-message figure stands for both."""
    if chat_template_tokens == 0:
        return 0, 0
    system, user = ({"role": role, "content": text}
                    for role, text in zip(("system", "user"), _PROBE, strict=True))  # fmt: skip
    alone, both = tokenizer.count_chat([system]), tokenizer.count_chat([system, user])
    if alone is None or both is None:
        return chat_template_tokens, chat_template_tokens
    system_text, user_text = (len(ids) for ids in tokenizer.encode_batch(_PROBE))
    return alone - system_text, both - alone - user_text


class _Conversation:
    """One session's messages so far."""

    def __init__(self, script: SessionScript, texts: AgenticTexts, endpoint: Endpoint) -> None:
        self.script = script
        self.texts = texts
        self.endpoint = endpoint
        self.messages: list[tuple[str, str]] = [("system", texts.system[script.system_prompt])]

    def request(self, turn: int, index: int, max_tokens: int) -> RequestSpec:
        text = self.texts.message(self.script, turn)
        history = tuple(self.messages)
        self.messages.append(("user", text))
        if self.endpoint is Endpoint.COMPLETIONS:
            text, history = "\n\n".join(t for _, t in self.messages), ()
        return RequestSpec(
            index=index, prompt=text, max_tokens=max_tokens,
            input_tokens=self.script.prompt_tokens(turn), history=history, turn=turn,
            session_id=self.script.session_id,
        )  # fmt: skip

    def answered(self, text: str) -> None:
        self.messages.append(("assistant", text))


class _Sessions:
    """Runs one level's sessions through one client."""

    def __init__(
        self, client: Client, plan: LoadPlan, spec: WorkloadSpec, texts: AgenticTexts
    ) -> None:
        self.client, self.plan, self.spec, self.texts = client, plan, spec, texts
        self.loop = SessionLoop(plan, spec)
        self.tally = Tally()
        self._index = itertools.count()

    def clock(self) -> float:
        return time.perf_counter() - self.client.t0

    async def run(self, on_progress: ProgressFn | None) -> None:
        self.tally.t0 = self.client.t0
        cpu0, wall0 = time.process_time(), time.perf_counter()
        ticker = asyncio.ensure_future(self._tick(on_progress)) if on_progress else None
        try:
            if self.plan.closed:
                workers = [asyncio.ensure_future(self._user())
                           for _ in range(int(self.plan.load.value))]  # fmt: skip
                await until_end(self.client, self.plan, self.clock, workers,
                                lambda: self.loop.end_s)  # fmt: skip
            else:
                await self._arrivals()
        finally:
            if ticker is not None:
                await cancel_and_wait(ticker)
        tally = self.tally
        tally.cpu_s, tally.wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
        tally.no_usage = self.client.no_usage
        if on_progress is not None:
            on_progress(tally.completed, tally.failed, self.clock())

    async def _tick(self, on_progress: ProgressFn) -> None:
        while True:
            await asyncio.sleep(PROGRESS_EVERY_S)
            on_progress(self.tally.completed, self.tally.failed, self.clock())

    async def _user(self) -> None:
        """Closed loop: one session after another."""
        while (slot := self.loop.start(self.clock())) is not None:
            await self._session(slot)

    async def _arrivals(self) -> None:
        """Open loop: a new session at each arrival."""
        sessions: set[asyncio.Future[None]] = set()
        for start_s in send_times(self.plan, None):
            while (wait := start_s - self.clock()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            if (slot := self.loop.start(start_s)) is None:
                break
            task = asyncio.ensure_future(self._session(slot))
            sessions.add(task)
            task.add_done_callback(sessions.discard)
        stop_s = self.clock()
        await until_end(self.client, self.plan, self.clock, list(sessions), lambda: stop_s)

    async def _session(self, slot: TurnSlot | None) -> None:
        assert slot is not None
        conversation = _Conversation(
            self.loop.scripts[slot.session], self.texts, self.client.target.endpoint
        )
        while slot is not None:
            while (wait := slot.send_s - self.clock()) > 0:  # noqa: ASYNC110
                await asyncio.sleep(wait)
            spec = conversation.request(slot.turn, next(self._index), self.spec.output_tokens)
            record, text = await self.client.converse(
                spec, intended_s=slot.send_s, warmup=slot.warmup
            )
            self.tally.lags_s.append(record.sent_s - slot.send_s)
            self.tally.add(record)
            conversation.answered(text)
            slot = self.loop.next(slot, record.extra["done_s"], record.ok)


async def run_agentic(
    target: Target,
    plan: LoadPlan,
    spec: WorkloadSpec,
    texts: AgenticTexts,
    *,
    on_progress: ProgressFn | None = None,
) -> LoadOutcome:
    """Run one level of sessions (`plan.load`: sessions live at a time, or started a second).
    Never raises for anything the server does; a failed turn ends its session."""
    if plan.processes not in (None, 1):
        raise ConfigError(
            f"--processes {plan.processes}: the agentic workload runs in one client process "
            "(each turn waits for the answer before it)"
        )
    raise_fd_limit()
    client = Client(target, keep_text=True)
    sessions = _Sessions(client, plan, spec, texts)
    try:
        if plan.closed:
            await client.preconnect(min(int(plan.load.value), PRECONNECT_MAX))
        client.t0 = time.perf_counter()
        await sessions.run(on_progress)
    except asyncio.CancelledError:
        started_at = time.time() - sessions.clock()
        cut = outcome(plan, [sessions.tally], started_at, 1)
        raise LoadInterrupted(cut, sessions.clock()) from None
    finally:
        await client.aclose()
    started_at = time.time() - (time.perf_counter() - client.t0)
    done = outcome(plan, [sessions.tally], started_at, 1)
    if not plan.closed:
        return done
    # Sessions wait between turns: the level ran at its load when that many were live.
    return dataclasses.replace(done, load_reached=sessions.loop.peak_live >= plan.load.value)
