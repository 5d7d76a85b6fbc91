"""`servepilot completion bash|zsh`: the script, sourced in a real shell, completes what the
parser knows: subcommands, each one's flags, and the values of flags that have known ones."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servepilot.cli.main import build_parser
from servepilot.core import completion

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("completion")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    paths = {}
    for shell in completion.SHELLS:
        done = subprocess.run(
            [sys.executable, "-m", "servepilot", "completion", shell],
            capture_output=True, text=True, env=env, check=True, timeout=60,
        )  # fmt: skip
        paths[shell] = folder / f"servepilot.{shell}"
        paths[shell].write_text(done.stdout)
    return paths


def _complete(shell: str, script: Path, line: str, cwd: Path | None = None) -> list[str]:
    """What `_servepilot` offers for the last word of `line` (which may be empty), run in
    `cwd` (default: a folder of its own, which zsh's compinit writes its cache into)."""
    cwd = cwd or script.parent
    words = shlex.split(line) + ([""] if line.endswith(" ") else [])
    array = " ".join(shlex.quote(w) for w in words)
    program = (
        f"source {script}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _servepilot; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    argv = ["bash", "--norc", "-c", program] if shell == "bash" else ["zsh", "-f", "-c", program]
    env = {"PATH": os.environ["PATH"], "HOME": str(cwd)}
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return [w for w in done.stdout.splitlines() if w]


SUBCOMMANDS = ["plan", "up", "status", "down", "logs", "sleep", "wake", "gateway", "bench",
               "calibrate", "profile", "sim", "tune", "k8s", "top", "doctor", "accept", "models",
               "batch", "config", "observe", "completion"]  # fmt: skip


@pytest.mark.parametrize(
    ("line", "offered"),
    [
        ("servepilot ", [*SUBCOMMANDS, "-h", "--help", "--version"]),
        ("servepilot bench --con", ["--concurrency"]),
        ("servepilot sim --policy pre", ["prefix_affinity", "predicted_latency"]),
        ("servepilot gateway --policy ",
         ["round_robin", "least_load", "prefix_affinity", "session", "length_shard", "hybrid",
          "predicted_latency"]),
        ("servepilot up --engine ", ["vllm", "sim"]),
        ("servepilot up --model llama-3.1-", ["llama-3.1-70b", "llama-3.1-8b"]),
        ("servepilot plan --accelerator h", ["h100-80", "h200-141"]),
        ("servepilot models ", ["list", "pull", "-h", "--help"]),
        ("servepilot k8s render --autoscaler ", ["hpa", "keda"]),
        # `sim` after --model is its value, not the subcommand: bench's flags follow.
        ("servepilot bench --model sim --requ", ["--requests"]),
        ("servepilot bench compare --", ["--help"]),
        # --detached-run-dir, hidden from --help, is not offered either.
        ("servepilot up --det", ["--detach"]),
    ],
)  # fmt: skip
def test_bash_completes_subcommands_flags_and_values(
    scripts: dict[str, Path], line: str, offered: list[str]
) -> None:
    assert _complete("bash", scripts["bash"], line) == offered


def test_bash_completes_file_paths_for_config_and_out(
    scripts: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "fleet.yaml").write_text("")
    (tmp_path / "fleets").mkdir()
    assert sorted(_complete("bash", scripts["bash"], "servepilot up -c fl", tmp_path)) == [
        "fleet.yaml", "fleets",
    ]  # fmt: skip
    assert _complete("bash", scripts["bash"], "servepilot sim --out fleets", tmp_path) == ["fleets"]


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_offers_the_same_candidates(scripts: dict[str, Path]) -> None:
    # zsh's bashcompinit filters the candidates by the typed prefix itself (its compgen
    # offers them all), so the words offered are those of the command reached.
    offered = _complete("zsh", scripts["zsh"], "servepilot sim --policy ")
    assert offered == ["round_robin", "least_load", "prefix_affinity", "session",
                       "length_shard", "hybrid", "predicted_latency"]  # fmt: skip
    assert "--concurrency" in _complete("zsh", scripts["zsh"], "servepilot bench --model sim --")
    assert _complete("zsh", scripts["zsh"], "servepilot models l") == [
        "list",
        "pull",
        "-h",
        "--help",
    ]


def test_every_subcommand_and_flag_of_the_parser_is_offered() -> None:
    # One source of truth: a flag added to any parser is completed with no list to update.
    cmds = {c.words: c for c in completion.commands(build_parser(), {})}
    assert cmds[()].subcommands == tuple(SUBCOMMANDS)
    assert ("models", "pull") in cmds and ("bench", "compare") in cmds
    parser = argparse.ArgumentParser(prog="x")
    parser.add_argument("--flag", action="store_true")
    parser.add_argument("--level", choices=["a", "b"])
    parser.add_argument("file", type=Path)
    (root,) = completion.commands(parser, {"--level": ["c", "a"]})
    assert root.options == (
        completion.Option(("-h", "--help"), False, (), False),
        completion.Option(("--flag",), False, (), False),
        completion.Option(("--level",), True, ("a", "b", "c"), False),
    )
    assert root.paths is True
