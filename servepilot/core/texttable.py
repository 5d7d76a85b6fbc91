"""A table as plain data, for the terminal (cli draws it with rich) and for reports."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TextTable:
    """A title, column names, rows of text, the columns of numbers (to align right) and a
    caption ("" for none)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: tuple[str, ...] = ()
    caption: str = ""
