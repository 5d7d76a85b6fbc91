"""What a new user follows leads somewhere: every relative link (and path) in the README and
docs/ names a file of this repository (or a reference page the docs build generates), every
page and section that what servepilot prints cites (`docs/ray.md, "Scaling out on Ray"`) is a
page of docs/ with that heading, and the first `make serve` says what it installs and how
long that takes before it goes quiet."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import servepilot
from servepilot.core.config import FleetConfig
from tests.unit.test_docs_site import gen_ref
from tests.unit.test_user_text_names_rules import REPO_ROOT, _descriptions, _printed_strings

README = REPO_ROOT / "README.md"
LINK = re.compile(r"\]\(\s*([^)\s]+)\s*\)")
# A path in a code span that climbs out of its folder: `../shared/DESIGN.md`.
CLIMBING_PATH = re.compile(r"`(\.\./[^`\s]+)`")
# `docs/autoscale.md, "Autoscaling policies"`, `docs/kubernetes.md: "Deploying on Kubernetes"`.
SECTION = re.compile(r'(docs/[\w-]+\.md)[,:] "([^"]+)"')


def _documents() -> list[Path]:
    return [README, *sorted((REPO_ROOT / "docs").rglob("*.md"))]


def _headings(path: Path) -> set[str]:
    headings, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            headings.add(line.lstrip("#").strip())
    return headings


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_relative_link_and_path_resolves_inside_the_repo() -> None:
    generated = {(REPO_ROOT / "docs" / page).resolve() for page in gen_ref().PAGES}
    broken = []
    for doc in _documents():
        text = doc.read_text(encoding="utf-8")
        anchors = {_anchor(h) for h in _headings(doc)}
        targets = [m.group(1) for m in LINK.finditer(text) if "://" not in m.group(1)]
        targets += [m.group(1) for m in CLIMBING_PATH.finditer(text)]
        for target in targets:
            path, _, anchor = target.partition("#")
            resolved = (doc.parent / path).resolve() if path else doc
            exists = resolved.exists() or resolved in generated
            inside = resolved.is_relative_to(REPO_ROOT) and exists
            if not inside or (not path and anchor not in anchors):
                broken.append(f"{doc.relative_to(REPO_ROOT)}: {target}")
    assert broken == []


def test_the_checks_catch_a_path_outside_and_a_missing_anchor() -> None:
    assert CLIMBING_PATH.search("are in `../shared/DESIGN.md`. The")
    assert _anchor("Autoscaling a running fleet: `up --autoscale`") == (
        "autoscaling-a-running-fleet-up---autoscale"
    )
    assert (REPO_ROOT / "../shared").resolve().is_relative_to(REPO_ROOT) is False


def _what_servepilot_prints() -> list[tuple[str, str]]:
    root = Path(servepilot.__file__).parent
    found = [
        (f"{path.relative_to(root)}:{line}", " ".join(text.split()))
        for path in sorted(root.rglob("*.py"))
        for line, text in _printed_strings(path)
    ]
    found += [(f"fleet.yaml {name}", " ".join(text.split())) for name, text in
              _descriptions(FleetConfig)]  # fmt: skip
    return [(where, text) for where, text in found if "README" in text or "docs/" in text]


def test_every_docs_section_servepilot_names_is_a_heading_of_that_page() -> None:
    printed = _what_servepilot_prints()
    cited = [(where, page, name) for where, text in printed
             for page, name in SECTION.findall(text)]  # fmt: skip
    assert len(cited) >= 3, "expected the texts that cite a docs section"
    missing = [
        f"{where}: {page} {name!r}"
        for where, page, name in cited
        if not (REPO_ROOT / page).is_file() or name not in _headings(REPO_ROOT / page)
    ]
    # The README is a quick start now: a section servepilot cites lives in a docs page.
    stale = [where for where, text in printed if re.search(r"README[,:'] ", text)]
    assert missing == [] and stale == []


def test_the_readme_says_how_to_serve_on_another_port() -> None:
    assert 'make serve ARGS="--port ' in README.read_text(encoding="utf-8")


@pytest.mark.skipif(subprocess.run(["which", "make"], capture_output=True).returncode != 0,
                    reason="no make")  # fmt: skip
def test_the_install_says_what_it_installs_and_how_long_before_the_long_pip_step() -> None:
    # -n prints the recipe without running it; -B as on a fresh clone.
    recipe = subprocess.run(
        ["make", "-n", "-B", "-C", str(REPO_ROOT), ".venv/.servepilot-installed"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.replace("\\\n", " ").splitlines()  # fmt: skip
    # The long step: the editable install, through uv (.ci/install.py) or pip.
    long_step = next(
        i
        for i, line in enumerate(recipe)
        if ("pip install" in line or "install.py" in line) and " -e " in line
    )
    said = [line for line in recipe[:long_step] if line.startswith("echo ")]
    assert any("vLLM" in line and re.search(r"\d+ minutes", line) for line in said), recipe
