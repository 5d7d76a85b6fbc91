"""Terminal output: results on stdout, progress and errors on stderr."""

from __future__ import annotations

import sys
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from servepilot.core.texttable import TextTable

# Piped output (a log file, a test) gets a wide fixed width: rich would otherwise assume 80
# columns and cut the URLs in tables.
_PIPED_WIDTH = 160

out_console = Console(highlight=False, width=None if sys.stdout.isatty() else _PIPED_WIDTH)
err_console = Console(
    stderr=True, highlight=False, width=None if sys.stderr.isatty() else _PIPED_WIDTH
)


def print_error(message: object) -> None:
    # Text, not markup: messages quote user input and log lines that may hold brackets.
    err_console.print(Text("error: ", style="bold red") + Text(str(message)))


def warning_text(message: str) -> Text:
    return Text("warning: ", style="bold yellow") + Text(message)


def print_warning(message: str) -> None:
    err_console.print(warning_text(message))


def print_step(message: str) -> None:
    err_console.print(Text("• ", style="cyan") + Text(message))


def print_marked(
    mark: str, style: str, line: str, details: Iterable[str | Text] = (), indent: int = 2
) -> None:
    """A verdict line on stdout (`PASS  1. title`, `problem  rule: summary`), `mark` in
    `style`, then its details indented, each on one line however long (a log is grepped)."""
    out_console.print(Text(mark, style=style) + Text(line))
    for detail in details:
        out_console.print(Text(" " * indent) + detail, soft_wrap=True)


def draw(table: TextTable, **options: Any) -> Table:
    """A TextTable from the package that owns its data, drawn as simple_table draws."""
    caption = {"caption": table.caption, "caption_justify": "left"} if table.caption else {}
    return simple_table(table.title, table.columns, table.rows, right=table.right,
                        **(caption | options))  # fmt: skip


def simple_table(
    title: str,
    columns: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    right: Collection[str] = (),
    no_wrap: bool = False,
    **options: Any,
) -> Table:
    """A table titled on the left with a plain rule under its head; `right`: the columns to
    right-align (numbers); `no_wrap`: keep every cell on one line (URLs); `options` go to
    rich's Table (and may replace those)."""
    settings: dict[str, Any] = {"title": title, "box": box.SIMPLE, "title_justify": "left"}
    table = Table(**(settings | options))
    for name in columns:
        table.add_column(name, justify="right" if name in right else "left", no_wrap=no_wrap)
    for row in rows:
        table.add_row(*row)
    return table
