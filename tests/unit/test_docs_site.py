"""The docs site: a short README that leads into it, every page in its navigation, reference pages
generated from the code that name every command, flag and fleet.yaml field, and shell blocks
that are either run by tests/integration/test_docs_commands.py or say what they need."""

from __future__ import annotations

import argparse
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import yaml

from servepilot.cli.main import build_parser
from servepilot.core.config import FleetConfig
from tests.unit.test_user_text_names_rules import REPO_ROOT, _descriptions

README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
# A shell block that cannot run on a CPU machine without a fleet opens with this comment,
# which the page shows: "# Needs a GPU", "# Needs a running fleet (`make serve`)".
NOT_RUN_HERE = "# Needs "


@dataclass(frozen=True)
class ShellBlock:
    path: Path
    line: int  # of the opening fence, 1-based
    script: str

    @property
    def needs(self) -> str | None:
        """What the block needs that a test run does not have, or None: it is run."""
        first = self.script.lstrip().splitlines()[0] if self.script.strip() else ""
        return first[len(NOT_RUN_HERE) :] if first.startswith(NOT_RUN_HERE) else None

    def where(self) -> str:
        inside = self.path.is_relative_to(REPO_ROOT)
        return f"{self.path.relative_to(REPO_ROOT) if inside else self.path}:{self.line}"


def shell_blocks(path: Path) -> list[ShellBlock]:
    blocks, lines = [], path.read_text(encoding="utf-8").splitlines()
    opening: int | None = None
    body: list[str] = []
    for number, line in enumerate(lines, 1):
        if opening is None and line.startswith("```"):
            opening, body = (number if line[3:].split()[:1] == ["bash"] else -number), []
        elif opening is not None and line.startswith("```"):
            if opening > 0:
                blocks.append(ShellBlock(path, opening, "\n".join(body) + "\n"))
            opening = None
        elif opening is not None:
            body.append(line)
    return blocks


def documents() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def gen_ref() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_ref", DOCS / "gen_ref.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_shell_blocks_are_told_apart_by_their_first_comment(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```bash\nservepilot plan\n```\n\n```python\nprint(1)\n```\n\n"
        "```bash\n# Needs a GPU\nservepilot profile\n```\n```\nplain\n```\n"
    )
    blocks = shell_blocks(page)
    assert [(b.line, b.needs) for b in blocks] == [(1, None), (9, "a GPU")]
    assert blocks[0].script == "servepilot plan\n"


def test_the_readme_is_short_and_keeps_the_commands_a_fresh_clone_runs() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    first = shell_blocks(README)[0].script.splitlines()
    assert [line.split()[:2] for line in first if not line.startswith("#")] == [
        ["make", "serve"],
        ["make", "test"],
    ]
    # The CI entry point runs the README's test command.
    assert "\nmake test\n" in (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")


def test_some_blocks_are_run_and_every_other_says_what_it_needs() -> None:
    blocks = [block for path in documents() for block in shell_blocks(path)]
    run = [block.where() for block in blocks if block.needs is None]
    assert any(where.startswith("README.md") for where in run), run
    # A marker must say what is needed, not just that something is.
    vague = [block.where() for block in blocks if block.needs is not None and len(block.needs) < 5]
    assert vague == []


def _nav_pages(nav: object) -> list[str]:
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for entry in nav for page in _nav_pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in _nav_pages(value)]
    return []


def _mkdocs_config() -> dict[str, object]:
    # mkdocs.yml names a Python function (the slug rule); this test only reads its structure.
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config: dict[str, object] = yaml.load(
        (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader
    )
    return config


def test_every_page_is_in_the_navigation_and_every_entry_is_a_page() -> None:
    nav = _nav_pages(_mkdocs_config()["nav"])
    on_disk = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    generated = set(gen_ref().PAGES)
    assert sorted(set(nav) - on_disk - generated) == []
    assert sorted(on_disk - set(nav)) == []
    assert generated <= set(nav) and not generated & on_disk


def test_the_docs_build_runs_strict_inside_make_test() -> None:
    makefile = (REPO_ROOT / "Makefile").read_text(encoding="utf-8")
    test_deps = re.search(r"^test:(.*)$", makefile, re.MULTILINE)
    assert test_deps is not None and "docs" in test_deps.group(1).split()
    assert re.search(r"^docs:.*\n\t.*mkdocs build --strict", makefile, re.MULTILINE)
    assert "/site/" in (REPO_ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()


def test_the_cli_reference_holds_every_command_and_every_flag() -> None:
    page = gen_ref().cli_reference()
    parser = build_parser()
    todo: list[tuple[str, argparse.ArgumentParser]] = [("servepilot", parser)]
    seen = 0
    while todo:
        name, command = todo.pop()
        assert f"## `{name}`" in page
        section = page.split(f"## `{name}`\n", 1)[1].split("\n## ", 1)[0]
        for action in command._actions:
            shown = action.help != argparse.SUPPRESS  # internal flags stay out of --help
            for flag in action.option_strings if shown else ():
                assert flag in section, (name, flag)
            if isinstance(action, argparse._SubParsersAction):
                todo += [(f"{name} {sub}", p) for sub, p in action.choices.items()]
        seen += 1
    assert seen > 20  # plan, up, bench, bench compare, k8s render, ...


def test_the_cli_reference_is_the_parsers_own_help() -> None:
    # Every command's description, as argparse wraps it, is on the page word for word.
    page = " ".join(gen_ref().cli_reference().split())
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                assert sub.description, name
                assert " ".join(sub.description.split()) in page, name


def test_the_fleet_yaml_reference_holds_every_field_under_its_section() -> None:
    page = gen_ref().config_reference()
    sections = dict(re.findall(r"^## `([\w.\[\]]+)`\n(.*?)(?=^## |\Z)", page, re.M | re.S))
    missing = []
    for path, _ in _descriptions(FleetConfig):
        section, _, field = path.rpartition(".")
        if section and f"| `{field}` |" not in sections.get(section, ""):
            missing.append(path)
    assert missing == []
    assert "| `max_num_seqs` | int or null | `null` |" in sections["engine"]
    assert "| `key_env` |" in sections["gateway.auth.keys[]"]
