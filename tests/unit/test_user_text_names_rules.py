"""What a user reads names the rule it applies, never the design document it came from:
"seed 004's budget" means nothing to a user, "the KV-a-third-of-memory budget" does.

Checked over every string servepilot can print (string literals other than docstrings), over
the fleet.yaml field descriptions `servepilot config` writes beside each field, and over the
README and docs/ (prose, examples and sample output alike)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pydantic import BaseModel

import servepilot
from servepilot.core.config import FleetConfig

# "--seed 123" and "the same flags and seed: ..." are the random seed; "seed 004", "seeds
# 000/003" and "(seed: 30 min+)" name documents.
DOCUMENT_NAME = re.compile(
    r"(?<!-)\bseeds? \d{3}|\bseeds?'s?(?=\W)|\bthe seeds?\b|\bseeds?: \d", re.IGNORECASE
)
REPO_ROOT = Path(__file__).resolve().parents[2]


def _docstrings(tree: ast.AST) -> set[int]:
    """Module, class and function docstrings, and attribute docstrings: not printed."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _printed_strings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
    ]


def test_no_printed_string_names_a_seed_document() -> None:
    root = Path(servepilot.__file__).parent
    found = [
        f"{path.relative_to(root)}:{line}: {text!r}"
        for path in sorted(root.rglob("*.py"))
        for line, text in _printed_strings(path)
        if DOCUMENT_NAME.search(text)
    ]
    assert found == []


def _descriptions(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for name, field in model.model_fields.items():
        out.append((prefix + name, field.description or ""))
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += _descriptions(annotation, f"{prefix}{name}.")
    return out


def test_no_fleet_yaml_field_description_names_a_seed_document() -> None:
    described = _descriptions(FleetConfig)
    found = [(path, text) for path, text in described if DOCUMENT_NAME.search(text)]
    assert found == []


def _user_documents() -> list[Path]:
    docs = sorted((REPO_ROOT / "docs").rglob("*"))
    return [REPO_ROOT / "README.md", *(p for p in docs if p.suffix in {".md", ".yaml", ".yml"})]


def test_no_readme_or_docs_line_names_a_seed_document() -> None:
    documents = _user_documents()
    assert REPO_ROOT / "docs" / "tradeoff.md" in documents
    found = [
        f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}"
        for path in documents
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if DOCUMENT_NAME.search(line)
    ]
    assert found == []


def test_the_pattern_tells_a_document_from_a_random_seed() -> None:
    assert DOCUMENT_NAME.search("the KV budget (seed 004's budget)")
    assert DOCUMENT_NAME.search("step: the seeds' +10% rules")
    assert DOCUMENT_NAME.search("the seed's 15-30 ms")
    assert DOCUMENT_NAME.search("no leak (seed: 30 min+)")
    assert not DOCUMENT_NAME.search("workload and arrival seed (default 0)")
    assert not DOCUMENT_NAME.search("same seeds, same request sizes")
    assert DOCUMENT_NAME.search("seeds 000/003's operating lines")
    assert DOCUMENT_NAME.search("# One 8-GPU node or ten? The seeds' trade-off, simulated")
    assert not DOCUMENT_NAME.search("servepilot bench --seed 123 --sweep 1,2")
    assert not DOCUMENT_NAME.search("60 simulated seconds per load level, seed 1")
    assert not DOCUMENT_NAME.search("with the same flags and seed: other lengths")
