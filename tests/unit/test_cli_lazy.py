"""A command line that names one command imports that command's module alone (every process
the tests and `up` spawn pays the imports), and parses exactly as the whole parser does."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servepilot.cli.main import COMMANDS, build_parser, main

ROOT = Path(__file__).resolve().parents[2]


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_command_is_mapped_to_the_module_that_registers_it() -> None:
    everything = _subcommands(build_parser())
    assert set(everything) == {*COMMANDS, "completion"}
    for name in COMMANDS:
        alone = _subcommands(build_parser(name))
        assert alone[name].format_help() == everything[name].format_help(), name


def test_a_named_command_imports_no_other_command_module() -> None:
    program = (
        "import sys\n"
        "from servepilot.cli.main import main\n"
        "code = main(['config'])\n"
        "print(sorted(m for m in sys.modules if m.endswith('_cmd')), code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=env, timeout=60, check=True)  # fmt: skip
    assert done.stdout.splitlines()[-1] == "['servepilot.cli.config_cmd'] 0"


@pytest.mark.parametrize("words", [["--help"], ["plna"]])
def test_help_and_a_mistyped_command_list_every_command(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main(words)
    shown = capsys.readouterr()
    text = shown.out + shown.err
    for name in COMMANDS:
        assert name in text, name
