"""The CLI's shared table helper."""

from __future__ import annotations

from rich import box
from rich.console import Console

from servepilot.cli.console import simple_table


def _text(table: object) -> str:
    console = Console(width=60, record=True)
    console.print(table)
    return console.export_text()


def test_simple_table_right_aligns_the_number_columns() -> None:
    table = simple_table("sizes", ("part", "GB"), [("weights", "1.50"), ("kv", "12.25")],
                         right=("GB",))  # fmt: skip
    assert [c.justify for c in table.columns] == ["left", "right"]
    lines = _text(table).splitlines()
    assert lines[0].startswith("sizes")  # titled on the left
    assert any(" 1.50" in line and "weights" in line for line in lines)
    assert table.box is box.SIMPLE


def test_rich_options_replace_the_defaults() -> None:
    table = simple_table("t", ("a",), [("x",)], box=box.SIMPLE_HEAD, caption="c")
    assert table.box is box.SIMPLE_HEAD and table.caption == "c"
