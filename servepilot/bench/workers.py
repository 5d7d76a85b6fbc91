"""Several client processes for one load, when one process cannot generate it.

Each process (multiprocessing, spawn) runs its own uvloop, `Client` and `Driver` on its share
of the slots (see drive.py) and sends its records back pickled. All share one time origin:
on Linux (and macOS, Windows) `time.perf_counter()` reads a system-wide monotonic clock, so
the parent's t0 means the same instant in every process; a process that finds the clocks
disagree (another platform) falls back to the wall clock to place t0.

Cut short (Ctrl-C reaches the parent, and in a terminal the children too), each process
stops its load and sends back what finished, so a soak cut short keeps its finished windows
with several processes as with one.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection as Pipe
from typing import Any

from servepilot.bench.client import Client, Target
from servepilot.bench.drive import (
    PROGRESS_EVERY_S,
    Driver,
    ProgressFn,
    Tally,
    raise_fd_limit,
)
from servepilot.bench.records import RequestSpec
from servepilot.core import loop
from servepilot.core.errors import ServepilotError
from servepilot.core.results import LoadMode
from servepilot.load.loadplan import LoadPlan
from servepilot.load.slots import concurrency_share

START_MARGIN_S = 0.2
"""Between the go message and t0, so every process is waiting when the load starts."""
PRECONNECT_MAX = 512
STOP_WAIT_S = 10.0
"""How long a cut-short load waits for its processes' finished requests."""


class ProcessesInterrupted(Exception):
    """The load was cut short: what the processes had finished (a process that died or did
    not answer in time is missing)."""

    def __init__(self, tallies: list[Tally], elapsed_s: float) -> None:
        super().__init__("the load was cut short")
        self.tallies = tallies
        self.elapsed_s = elapsed_s


async def run_processes(
    target: Target,
    plan: LoadPlan,
    requests: Sequence[RequestSpec],
    processes: int,
    on_progress: ProgressFn | None,
) -> list[Tally]:
    """Run `plan` on `processes` spawned processes; the tallies of all, in process order."""
    ctx = multiprocessing.get_context("spawn")
    pipes: list[Pipe] = []
    children = []
    try:
        for part in range(processes):
            ours, theirs = ctx.Pipe()
            child = ctx.Process(
                target=_child,
                args=(theirs, target, plan, tuple(requests), part, processes),
                daemon=True,
            )
            child.start()
            theirs.close()
            pipes.append(ours)
            children.append(child)
        await _gather(pipes, children, "ready")
        t0 = time.perf_counter() + START_MARGIN_S
        wall0 = time.time() + START_MARGIN_S
        for pipe in pipes:
            pipe.send(("go", t0, wall0, time.perf_counter(), time.time()))
        tallies: list[Tally | None] = [None] * len(pipes)
        try:
            await _collect(pipes, children, t0, on_progress, tallies)
        except asyncio.CancelledError:
            elapsed_s = time.perf_counter() - t0
            raise ProcessesInterrupted(_stop_all(pipes, children, tallies), elapsed_s) from None
        return [t for t in tallies if t is not None]
    finally:
        for child in children:
            if child.is_alive():
                child.terminate()
            child.join(5)
        for pipe in pipes:
            pipe.close()


async def _gather(pipes: list[Pipe], children: list[Any], kind: str) -> list[Any]:
    """One message of `kind` from every child (their order), failing if one died or erred."""
    got: list[Any] = [None] * len(pipes)
    while any(g is None for g in got):
        for part, pipe in enumerate(pipes):
            if got[part] is None and (message := _receive(pipe, children, part)) is not None:
                got[part] = _expect(message, kind, part)
        await asyncio.sleep(0.02)
    return got


async def _collect(
    pipes: list[Pipe],
    children: list[Any],
    t0: float,
    on_progress: ProgressFn | None,
    tallies: list[Tally | None],
) -> None:
    """Fill `tallies` (in process order) as the processes finish."""
    counts = [(0, 0)] * len(pipes)
    reported = 0.0
    while any(t is None for t in tallies):
        for part, pipe in enumerate(pipes):
            while tallies[part] is None and (message := _receive(pipe, children, part)):
                if message[0] == "progress":
                    counts[part] = (message[1], message[2])
                else:
                    tallies[part] = _expect(message, "done", part)
        now = time.perf_counter()
        if on_progress is not None and now - reported >= PROGRESS_EVERY_S:
            reported = now
            on_progress(sum(c for c, _ in counts), sum(f for _, f in counts), now - t0)
        await asyncio.sleep(0.05)


def _stop_all(pipes: list[Pipe], children: list[Any], tallies: list[Tally | None]) -> list[Tally]:
    """Tell the processes still running to stop, and take what each finished (waiting up to
    STOP_WAIT_S; blocking: the caller's task is being cancelled)."""
    for part, pipe in enumerate(pipes):
        if tallies[part] is None:
            with contextlib.suppress(OSError):  # gone already: its records are lost
                pipe.send(("stop",))
    lost: set[int] = set()
    deadline = time.monotonic() + STOP_WAIT_S
    while time.monotonic() < deadline:
        waiting = [i for i, t in enumerate(tallies) if t is None and i not in lost]
        if not waiting:
            break
        for part in waiting:
            try:
                message = _receive(pipes[part], children, part)
            except ServepilotError:
                lost.add(part)
                continue
            if message is not None and message[0] == "done":
                tallies[part] = message[1]
            elif message is not None and message[0] == "error":
                lost.add(part)
        time.sleep(0.02)
    return [t for t in tallies if t is not None]


def _receive(pipe: Pipe, children: list[Any], part: int) -> tuple[Any, ...] | None:
    """The child's next message, None if there is none yet; raises if the child died."""
    try:
        if pipe.poll():
            message: tuple[Any, ...] = pipe.recv()
            return message
    except (EOFError, OSError):
        pass
    else:
        if children[part].is_alive():
            return None
    code = children[part].exitcode
    raise ServepilotError(f"bench client process {part} died (exit code {code})")


def _expect(message: tuple[Any, ...], kind: str, part: int) -> Any:
    if message[0] == "error":
        raise ServepilotError(f"bench client process {part} failed:\n{message[1]}")
    if message[0] != kind:
        raise ServepilotError(f"bench client process {part} sent {message[0]!r}, not {kind!r}")
    return message[1]


def _child(
    pipe: Pipe,
    target: Target,
    plan: LoadPlan,
    requests: tuple[RequestSpec, ...],
    part: int,
    parts: int,
) -> None:
    try:
        loop.run(_child_main(pipe, target, plan, requests, part, parts))
    except BaseException:
        pipe.send(("error", traceback.format_exc()))
    finally:
        pipe.close()


async def _child_main(
    pipe: Pipe,
    target: Target,
    plan: LoadPlan,
    requests: tuple[RequestSpec, ...],
    part: int,
    parts: int,
) -> None:
    raise_fd_limit()
    client = Client(target)
    driver = Driver(client, plan, requests, part, parts)
    if plan.load.mode is LoadMode.CONCURRENCY:
        share = concurrency_share(int(plan.load.value), part, parts)
        await client.preconnect(min(share, PRECONNECT_MAX))
    pipe.send(("ready", part))
    _, t0, wall0, their_perf, their_wall = pipe.recv()
    # Same clock if perf_counter advanced like the wall clock since the parent read both.
    same_clock = abs((time.perf_counter() - their_perf) - (time.time() - their_wall)) < 0.05
    client.t0 = t0 if same_clock else time.perf_counter() + (wall0 - time.time())

    def progress(completed: int, failed: int, elapsed_s: float) -> None:
        pipe.send(("progress", completed, failed))

    run = asyncio.ensure_future(driver.run(progress))
    stop = asyncio.ensure_future(_told_to_stop(pipe))
    # Cancelled: SIGINT reached the whole group (Ctrl-C in a terminal); the load stops as if
    # told to, and this process still reports what finished.
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait([run, stop], return_when=asyncio.FIRST_COMPLETED)
    for task in (run, stop):
        task.cancel()
    await asyncio.wait([run, stop])
    await client.aclose()
    # Cut short, the driver's tally holds the requests that finished before the cut.
    pipe.send(("done", driver.tally if run.cancelled() else run.result()))


async def _told_to_stop(pipe: Pipe) -> None:
    """Returns when the parent says stop (the only message it sends after "go")."""
    told = asyncio.Event()
    running = asyncio.get_running_loop()
    running.add_reader(pipe.fileno(), told.set)
    try:
        await told.wait()
    finally:
        running.remove_reader(pipe.fileno())
    pipe.recv()
