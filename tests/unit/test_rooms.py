"""Each thing in its room: the tests import the package and tests/support, never `benchmarks`
(what they share with the benchmarks lives in servepilot/ or tests/support/; tests of the
benchmarks' own logic live in benchmarks/tests/)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# A child process's code that puts benchmarks/ on its path imports a benchmark by its bare name.
_ON_THE_PATH = re.compile(r"sys\.path\.(insert|append)\([^)\n]*[\"']benchmarks[/\"']")


def imports_of(source: str, package: str) -> list[int]:
    """The lines of `source` that import `package` or one of its modules, at any depth (a
    function's late import too)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        if any(name == package or name.startswith(package + ".") for name in names):
            lines.append(node.lineno)
    return lines


def benchmarks_on_the_path(source: str) -> list[int]:
    return [n for n, line in enumerate(source.splitlines(), 1) if _ON_THE_PATH.search(line)]


def test_the_check_sees_every_form_of_import() -> None:
    source = (
        "import benchmarks\n"
        "from benchmarks import bench_tune\n"
        "def f() -> None:\n"
        "    import benchmarks.stub_server as s\n"
        "from benchmarks_extra import x\n"
        "from tests.support.stub_server import StubConfig\n"
    )
    assert imports_of(source, "benchmarks") == [1, 2, 4]
    folder = "benchmarks"  # spelt apart, so this file's own source does not match
    child = f'CODE = """\nimport sys\nsys.path.insert(0, "{folder}")\nimport bench_sim\n"""\n'
    assert benchmarks_on_the_path(child) == [3]
    assert benchmarks_on_the_path('sys.path.insert(0, "tests/support")\n') == []


def test_no_test_imports_the_benchmarks() -> None:
    offenders = [
        f"{path.relative_to(TESTS.parent)}:{line}"
        for path in sorted(TESTS.rglob("*.py"))
        for source in [path.read_text(encoding="utf-8")]
        for line in imports_of(source, "benchmarks") + benchmarks_on_the_path(source)
    ]
    assert offenders == []
