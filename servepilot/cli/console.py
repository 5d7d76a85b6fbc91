"""Terminal output: results on stdout, progress and errors on stderr."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.text import Text

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


def print_warning(message: str) -> None:
    err_console.print(Text("warning: ", style="bold yellow") + Text(message))


def print_step(message: str) -> None:
    err_console.print(Text("• ", style="cyan") + Text(message))
