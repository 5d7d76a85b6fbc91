"""Shell completion scripts generated from an argparse parser.

The parser is the one source of truth: subcommands, each subcommand's flags, and a flag's
values where the parser knows them (`choices`, a `Path` type for files and folders) come from
it, so completion cannot drift from `--help`. Values the parser cannot know (model preset
names) are passed in by flag.

bash gets a `complete -F` function; zsh gets the same function through zsh's bashcompinit (its
emulation of bash's `complete`), so both shells complete alike.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SHELLS = ("bash", "zsh")


@dataclass(frozen=True, slots=True)
class Option:
    flags: tuple[str, ...]
    takes_value: bool
    values: tuple[str, ...]
    """Words to offer for its value."""
    paths: bool
    """Its value is a file or a folder."""


@dataclass(frozen=True, slots=True)
class Command:
    words: tuple[str, ...]
    """The subcommand words after the program name (empty: the program itself)."""
    subcommands: tuple[str, ...]
    options: tuple[Option, ...]
    paths: bool
    """A positional argument is a file or a folder."""


def commands(
    parser: argparse.ArgumentParser,
    values: Mapping[str, Sequence[str]],
    words: tuple[str, ...] = (),
) -> Iterator[Command]:
    """Every command of `parser`, itself first, then its subcommands' depth first.
    `values`: words to offer for the flags named (any command's `--model`, say)."""
    subparsers: dict[str, argparse.ArgumentParser] = {}
    options = []
    paths = False
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            subparsers.update(action.choices)
        elif action.help == argparse.SUPPRESS:
            continue  # hidden from --help, so from completion too
        elif action.option_strings:
            offered = [str(c) for c in action.choices or ()]
            offered += [v for flag in action.option_strings for v in values.get(flag, ())]
            known = list(dict.fromkeys(offered))
            options.append(
                Option(tuple(action.option_strings), action.nargs != 0, tuple(known),
                       action.type is Path)
            )  # fmt: skip
        else:
            paths = paths or action.type is Path
    yield Command(words, tuple(subparsers), tuple(options), paths)
    for name, sub in subparsers.items():
        yield from commands(sub, values, (*words, name))


def script(shell: str, parser: argparse.ArgumentParser, values: Mapping[str, Sequence[str]]) -> str:
    """The completion script for `shell` (one of SHELLS) of the program `parser` parses."""
    body = bash_function(parser.prog, list(commands(parser, values)))
    # `-o default`: where nothing is offered (a model folder after --model), file names are.
    complete = f"complete -o default -F _{parser.prog} {parser.prog}\n"
    if shell == "bash":
        return body + complete
    return (
        "if ! (( $+functions[compdef] )); then autoload -U +X compinit && compinit; fi\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + body + complete
    )


def bash_function(prog: str, cmds: Sequence[Command]) -> str:
    """`_prog`: finds the subcommand typed so far (skipping flags and their values), then
    offers its subcommands and flags, or the values of the flag just typed."""
    subcommand = _alternatives(f"{_key(c.words[:-1])}|{c.words[-1]}" for c in cmds if c.words)
    takes_value = _alternatives(
        f"{_key(c.words)}|{flag}" for c in cmds for o in c.options if o.takes_value
        for flag in o.flags
    )  # fmt: skip
    value_cases = "".join(
        _case((f"{_key(c.words)}|{f}" for f in o.flags), o.values, o.paths)
        for c in cmds for o in c.options if o.values or o.paths
    )  # fmt: skip
    command_cases = "".join(
        _case([_key(c.words)], [*c.subcommands, *(f for o in c.options for f in o.flags)], c.paths)
        for c in cmds
    )
    return f"""\
# {prog} completion, generated from its own parser (`{prog} completion bash|zsh`).
_{prog}() {{
    [[ -n ${{ZSH_VERSION-}} ]] && setopt localoptions ksharrays shwordsplit
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    local cmd="" word="" value=0 i
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${{COMP_WORDS[i]}}"
        if ((value)); then value=0; continue; fi
        case "$cmd|$word" in
            {subcommand}) cmd="${{cmd:+$cmd }}$word" ;;
            {takes_value}) value=1 ;;
        esac
    done
    local words="" paths=0
    if ((value)); then
        case "$cmd|$prev" in
{value_cases}        esac
    else
        case "$cmd" in
{command_cases}        esac
    fi
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    if ((paths)); then
        local IFS=$'\\n'
        COMPREPLY+=($(compgen -f -- "$cur"))
        compopt -o filenames 2>/dev/null
    fi
    return 0
}}
"""


def _key(words: Sequence[str]) -> str:
    return " ".join(words)


def _alternatives(patterns: Iterator[str] | Sequence[str]) -> str:
    # `''` never matches ("$cmd|$word" always holds a `|`): a case needs a pattern.
    return "|".join(f'"{p}"' for p in patterns) or "''"


def _case(patterns: Iterator[str] | Sequence[str], words: Sequence[str], paths: bool) -> str:
    action = f'words="{" ".join(words)}"' + ("; paths=1" if paths else "")
    return f"            {_alternatives(patterns)}) {action} ;;\n"
