"""Every shell block of the README and the docs that can run on a CPU machine without a fleet
runs, as a reader would run it: a page's blocks in order, in one fresh folder (a block may use
the fleet.yaml an earlier one wrote), with `.venv/bin/` being this interpreter's folder. A block
that needs more says so in its first line (`# Needs a GPU`), which
tests/unit/test_docs_site.py reads. The README's tour, which needs a running fleet, runs
against simulated replicas."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.fleetproc import running_fleet
from tests.unit.test_docs_site import README, ShellBlock, documents, shell_blocks
from tests.unit.test_user_text_names_rules import REPO_ROOT

# The repository folders the blocks name (docs/examples/..., tests/data/...).
LINKED = ("docs", "tests", "benchmarks")
PAGE_TIMEOUT_S = 300
# The README's tour: what needs `make serve` running, on the gateway's default port.
TOUR = "a running fleet (`make serve`)"
DEFAULT_GATEWAY = "127.0.0.1:8000"


def _runnable() -> dict[str, list[ShellBlock]]:
    pages = {}
    for path in documents():
        blocks = [block for block in shell_blocks(path) if block.needs is None]
        if blocks:
            pages[str(path.relative_to(REPO_ROOT))] = blocks
    return pages


def _run_page(
    blocks: list[ShellBlock], folder: Path, base_env: dict[str, str] | None = None, port: int = 0
) -> list[str]:
    for name in LINKED:
        (folder / name).symlink_to(REPO_ROOT / name)
    bindir = Path(sys.executable).parent
    env = {
        **(base_env or os.environ),
        "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO_ROOT),
        "COLUMNS": "120",
    }
    failed = []
    for block in blocks:
        script = block.script.replace(".venv/bin/", f"{bindir}/")
        if port:
            script = script.replace(DEFAULT_GATEWAY, f"127.0.0.1:{port}")
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script],
            cwd=folder, env=env, capture_output=True, text=True, timeout=PAGE_TIMEOUT_S,
        )  # fmt: skip
        if done.returncode != 0:
            failed.append(
                f"{block.where()} exited {done.returncode}:\n{block.script}"
                f"{done.stdout[-1500:]}\n{done.stderr[-1500:]}"
            )
    return failed


@pytest.mark.timeout(PAGE_TIMEOUT_S * 2)
@pytest.mark.parametrize("page", sorted(_runnable()))
def test_the_pages_shell_blocks_run(page: str, tmp_path: Path) -> None:
    assert _run_page(_runnable()[page], tmp_path) == []


def test_a_block_that_fails_is_reported_with_its_place(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\ntrue\n```\n\n```bash\n.venv/bin/python -c 'raise SystemExit(3)'\n```\n"
    )
    work = tmp_path / "work"
    work.mkdir()
    failed = _run_page(shell_blocks(page), work)
    assert len(failed) == 1 and ":5 exited 3" in failed[0]


@pytest.mark.timeout(PAGE_TIMEOUT_S * 2)
def test_the_readme_tour_runs_against_a_simulated_fleet(tmp_path: Path) -> None:
    blocks = [block for block in shell_blocks(README) if block.needs == TOUR]
    assert len(blocks) >= 2  # a request, then bench and down
    work = tmp_path / "work"
    work.mkdir()
    # SERVEPILOT_STATE keeps the tour's bare `servepilot down` to this fleet alone.
    with running_fleet(tmp_path / "state", replicas=1, extra=["--engine", "sim"]) as fleet:
        assert _run_page(blocks, work, fleet.env, fleet.port) == []
        assert fleet.proc.wait(timeout=60) == 0  # the tour's `down` stopped it
    results = json.loads((work / "runs" / "tour" / "results.json").read_text())
    levels = [(run["load"]["value"], run["completed"], run["failed"]) for run in results["runs"]]
    assert levels == [(1, 4, 0), (2, 4, 0)]
