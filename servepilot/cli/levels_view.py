"""What `servepilot bench` and `servepilot sim` show of a run of load levels: one progress row
a level while it runs (plain lines at a bounded rate when stderr is not a terminal, so a log
shows them), then the run table, the sweet spot and results.json. A measured and a simulated
run read the same way, as their results do."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from rich.console import Console, RenderableType
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from servepilot.bench.console import (
    ending,
    level_summary,
    progress_counts,
    progress_left,
    render_runs_table,
    run_warnings,
    sweet_spot_line,
)
from servepilot.bench.report.fmt import level_name
from servepilot.bench.session import BenchReporter, LevelProgress
from servepilot.cli.console import err_console, out_console, print_step, print_warning
from servepilot.core.results import BenchResult, Load, Run
from servepilot.fleet.soak_memory import MemorySampler, soak_memory


class LevelBars:
    """One row a load level: the load, a bar, a counts field, the time it has taken."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._tasks: dict[Load, TaskID] = {}

    def start(self, load: Load, total: float | None) -> None:
        """`total`: requests, or seconds for a duration-bound level; None: unknown."""
        self._tasks[load] = self._bar.add_task(level_name(load), total=total, counts="")

    def update(self, load: Load, completed: float, counts: str, left: str = "") -> None:
        """`left`: what is left of the run (`2-4 min left`), when known."""
        counts = f"{counts} · {left}" if left else counts
        self._bar.update(self._tasks[load], completed=completed, counts=counts)

    def finish(self, run: Run) -> None:
        task = self._tasks[run.load]
        self._bar.update(task, completed=self._bar.tasks[task].total, counts=level_summary(run))

    def note(self, message: RenderableType) -> None:
        """A line above the bars (printing to the console directly would break them)."""
        self._bar.console.print(message)


PLAIN_EVERY_S = 10.0
"""A log gets a running level's progress at most this often (and at each level's start and end)."""


class PlainLevels:
    """The same progress as plain lines, for a log file or CI, where a bar shows nothing:
    `level 2 · concurrency 2: 12 ok, 1 failed · 0:00:20 elapsed · 2-4 min left`."""

    def __init__(
        self,
        console: Console,
        every_s: float = PLAIN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._console, self._every_s, self._clock = console, every_s, clock
        self._started: dict[Load, tuple[int, float]] = {}
        self._last_s = 0.0

    def start(self, load: Load, total: float | None) -> None:
        del total  # the level's size is in the estimate lines
        now = self._clock()
        self._started[load] = (len(self._started) + 1, now)
        self._last_s = now
        self._line(load, "started")

    def update(self, load: Load, completed: float, counts: str, left: str = "") -> None:
        del completed
        now = self._clock()
        if now - self._last_s >= self._every_s:
            self._last_s = now
            elapsed = f"{_clock_text(now - self._started[load][1])} elapsed"
            self._line(load, " · ".join(part for part in (counts, elapsed, left) if part))

    def finish(self, run: Run) -> None:
        took_s = self._clock() - self._started[run.load][1]
        self._line(run.load, f"done in {_clock_text(took_s)}: {level_summary(run)}")

    def note(self, message: RenderableType) -> None:
        # One line per message, however long: a log is read with grep.
        self._console.print(message, soft_wrap=True)

    def _line(self, load: Load, what: str) -> None:
        number = self._started[load][0]
        self._console.print(Text(f"level {number} · {level_name(load)}: {what}"), soft_wrap=True)


def _clock_text(seconds: float) -> str:
    """`0:03:10`, as the bar's elapsed column shows it: to the second, unlike the estimates."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


@contextmanager
def level_bars() -> Iterator[LevelBars | PlainLevels]:
    if not err_console.is_terminal:
        yield PlainLevels(err_console)
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as bar:
        yield LevelBars(bar)


def bench_reporter(bars: LevelBars | PlainLevels) -> BenchReporter:
    """bench's progress callbacks drawn on `bars` (bench and accept run bench's session)."""

    def started(load: Load, requests: int | None, duration_s: float | None) -> None:
        bars.start(load, requests if requests is not None else duration_s)

    def progress(p: LevelProgress) -> None:
        done = p.completed + p.failed if p.planned is not None else p.elapsed_s
        counts = progress_counts(p.completed, p.failed)
        bars.update(p.load, done, counts, progress_left(p.left_s))

    return BenchReporter(started, progress, bars.finish, bars.note)


def print_runs(result: BenchResult, stats: Sequence[str] = ()) -> None:
    """The run table and the sweet-spot line on stdout; on stderr each run's `stats` line (the
    simulator's), when given, and its warnings."""
    out_console.print(render_runs_table(result))
    if result.sweet_spot is not None:
        out_console.print(Text(sweet_spot_line(result)))
    for run, line in itertools.zip_longest(result.runs, stats):
        if line is not None:
            print_step(f"{level_name(run.load)}: {line}")
        for warning in run_warnings(run):
            print_warning(warning)


def exit_code(result: BenchResult, *, measured: bool) -> int:
    """bench's and sim's exit code for `result`, saying why when it is not 0."""
    code, why = ending(result, measured=measured)
    if why is not None:
        print_warning(why)
    return code


def memory_sources(root: str) -> MemorySampler | None:
    """A soak's memory sources beyond `root`'s /metrics: the replica processes and GPUs of the
    fleet `up` runs here at `root`, if it does (said on stderr)."""
    memory = soak_memory(root)
    print_step(memory.described)
    return memory.sampler
