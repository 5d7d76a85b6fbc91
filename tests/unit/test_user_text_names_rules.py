"""What a user reads names the rule it applies, never the design document it came from:
"seed 004's budget" means nothing to a user, "the KV-a-third-of-memory budget" does.

Checked over every string servepilot can print (string literals other than docstrings), and
over the fleet.yaml field descriptions `servepilot config` writes beside each field."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from pydantic import BaseModel

import servepilot
from servepilot.core.config import FleetConfig

DOCUMENT_NAME = re.compile(
    r"\bseed \d{3}|\bseeds?'s?(?=\W)|\bthe seeds?\b|\bseeds?:", re.IGNORECASE
)


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


def test_the_pattern_tells_a_document_from_a_random_seed() -> None:
    assert DOCUMENT_NAME.search("the KV budget (seed 004's budget)")
    assert DOCUMENT_NAME.search("step: the seeds' +10% rules")
    assert DOCUMENT_NAME.search("the seed's 15-30 ms")
    assert DOCUMENT_NAME.search("no leak (seed: 30 min+)")
    assert not DOCUMENT_NAME.search("workload and arrival seed (default 0)")
    assert not DOCUMENT_NAME.search("same seeds, same request sizes")
