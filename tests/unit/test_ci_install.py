"""`make install`'s installer (.ci/install.py) gives uv what pip's configuration says, and
leaves to pip whatever it cannot translate."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "install.py"


@pytest.fixture(scope="module")
def install() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_install", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_indexes_find_links_and_constraints_become_uv_flags(
    install: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    settings = {"extra-index-url": "file:///a/simple file:///b/simple", "find-links": "/w",
                "constraint": "/c.txt", "no-index": "false", "cert": "/ca.pem",
                "default-timeout": "180"}  # fmt: skip
    flags, env = install.uv_flags(settings)
    assert flags == ["--index-strategy", "unsafe-best-match",
                     "--extra-index-url", "file:///a/simple",
                     "--extra-index-url", "file:///b/simple",
                     "--find-links", "/w", "--constraint", "/c.txt"]  # fmt: skip
    assert env["SSL_CERT_FILE"] == "/ca.pem"
    assert install.uv_flags({"no-index": "true"})[0][-1] == "--no-index"


def test_a_setting_it_cannot_translate_leaves_the_install_to_pip(install: ModuleType) -> None:
    assert install.uv_flags({"prefer-binary": "1"}) == (
        "pip's setting prefer-binary='1' has no translation for uv here"
    )
