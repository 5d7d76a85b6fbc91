"""DESIGN.md's import rules, as pyproject.toml's import-linter contracts: kept by the tree, and
broken by a wrong arrow (the simulator importing bench, routing importing the gateway)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: `make install` installs import-linter")
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(cwd)},
        timeout=120,
    )


def _copy_tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "servepilot", tmp_path / "servepilot",
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_every_contract() -> None:
    done = _lint_imports(ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " 0 broken" in done.stdout


@pytest.mark.parametrize(
    ("module", "wrong_import", "contract"),
    [
        ("sim/fleet/network.py", "from servepilot.bench import client", "sim imports only"),
        ("routing/base.py", "from servepilot.gateway import app", "routing imports nothing"),
        ("core/units.py", "import servepilot.plan.kv", "core imports nothing of ours"),
        ("http1/server.py", "from servepilot.gateway import errors", "http1 imports nothing"),
        ("calibrate/fit.py", "import rich.table", "calibrate imports only"),
        ("fleet/ray/placement.py", "import ray", "only the Ray backend imports ray"),
        ("gateway/pool.py", "import ray.util", "only the Ray backend imports ray"),
        ("observe/alerts.py", "from servepilot.fleet import up", "observe imports only"),
        ("observe/dashboard.py", "from servepilot.gateway import app", "observe imports only"),
        ("observe/dashboard.py", "import rich.table", "observe imports only"),
    ],
)
def test_a_wrong_arrow_breaks_its_contract(
    tmp_path: Path, module: str, wrong_import: str, contract: str
) -> None:
    tree = _copy_tree(tmp_path)
    path = tree / "servepilot" / module
    text = path.read_text() if path.exists() else '"""Scratch."""\n'
    path.write_text(text + f"\n{wrong_import}  # noqa\n")
    done = _lint_imports(tree)
    assert done.returncode == 1, done.stdout[-3000:]
    broken = done.stdout.split("Broken contracts")[-1]
    assert contract in broken, broken[-3000:]
