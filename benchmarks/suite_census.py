"""How much the test suite checks, counted from its source: test functions, `assert`
statements and `pytest.raises` blocks per folder of pytest's testpaths, so that a change that
makes the suite faster can show it checks as much as before.

    python benchmarks/suite_census.py            # totals per folder
    python benchmarks/suite_census.py --files    # and per file

The count is static (an assert in a loop or a helper counts once); pair it with
`pytest --collect-only -q | tail -1` for the number of test items.
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST_FOLDERS = ("tests", "benchmarks/tests")


def census(source: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            counts["asserts"] += 1
        elif isinstance(node, ast.Call) and _is_pytest_raises(node.func):
            counts["raises"] += 1
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test_"
        ):
            counts["test functions"] += 1
    return counts


def _is_pytest_raises(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "raises"
        and isinstance(func.value, ast.Name)
        and func.value.id == "pytest"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", action="store_true", help="print every file's counts too")
    args = parser.parse_args(argv)
    folders: dict[str, Counter[str]] = {}
    paths = sorted({path for top in TEST_FOLDERS for path in (ROOT / top).rglob("*.py")})
    for path in paths:
        counts = census(path.read_text())
        folder = str(path.parent.relative_to(ROOT))
        folders.setdefault(folder, Counter()).update(counts)
        if args.files and counts:
            print(f"{path.relative_to(ROOT)}: {_line(counts)}")
    total: Counter[str] = Counter()
    for folder, counts in folders.items():
        total.update(counts)
        print(f"{folder}: {_line(counts)}")
    print(f"total: {_line(total)}")
    return 0


def _line(counts: Counter[str]) -> str:
    keys = ("test functions", "asserts", "raises")
    return ", ".join(f"{counts[key]} {key}" for key in keys)


if __name__ == "__main__":
    raise SystemExit(main())
