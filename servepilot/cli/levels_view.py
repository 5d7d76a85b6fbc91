"""What `servepilot bench` and `servepilot sim` show of a run of load levels: one progress row
a level while it runs, then the run table, the sweet spot and results.json. A measured and a
simulated run read the same way, as their results do."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import RenderableType
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from servepilot.bench.console import ending, level_summary, render_runs_table, sweet_spot_line
from servepilot.bench.report.fmt import level_name
from servepilot.cli.console import err_console, out_console
from servepilot.core.results import BenchResult, Load, Run


class LevelBars:
    """One row a load level: the load, a bar, a counts field, the time it has taken."""

    def __init__(self, bar: Progress) -> None:
        self._bar = bar
        self._tasks: dict[Load, TaskID] = {}

    def start(self, load: Load, total: float | None) -> None:
        """`total`: requests, or seconds for a duration-bound level; None: unknown."""
        self._tasks[load] = self._bar.add_task(level_name(load), total=total, counts="")

    def update(self, load: Load, completed: float, counts: str) -> None:
        self._bar.update(self._tasks[load], completed=completed, counts=counts)

    def finish(self, run: Run) -> None:
        task = self._tasks[run.load]
        self._bar.update(task, completed=self._bar.tasks[task].total, counts=level_summary(run))

    def note(self, message: RenderableType) -> None:
        """A line above the bars (printing to the console directly would break them)."""
        self._bar.console.print(message)


@contextmanager
def level_bars() -> Iterator[LevelBars]:
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[counts]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err_console, transient=False) as bar:
        yield LevelBars(bar)


def print_runs(result: BenchResult) -> None:
    """The run table and the sweet-spot line, on stdout."""
    out_console.print(render_runs_table(result))
    if result.sweet_spot is not None:
        out_console.print(Text(sweet_spot_line(result)))


def exit_code(result: BenchResult, *, measured: bool) -> int:
    """bench's and sim's exit code for `result`, saying why when it is not 0."""
    code, why = ending(result, measured=measured)
    if why is not None:
        err_console.print(Text("warning: ", style="yellow") + Text(why))
    return code
