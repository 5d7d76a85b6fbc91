"""The compiled simulator core: loads a mypyc build of the hot modules when one matches.

Why: a fleet simulation spends its time in a few modules (the scheduler, the block pool, the
fleet loop, the simulated gateway); compiled with mypyc they run several times faster. The
Python sources stay the source of truth: `make sim-fast` (`python -m
servepilot.sim.accel_build`) compiles `COMPILED` into a cache directory named by `build_key`,
a hash of every source the compiled code was built against and of the Python build. A stale
build is never loaded: when a source changes, so does the key, and the modules are imported
from their Python sources again (`status()` says why).

How: the package's __init__ imports this module before anything else, so the finder is in
place before any compiled module could be imported from source; a module is either compiled
everywhere in a process or nowhere. The build's shared library is loaded up front, so that a
build that cannot load falls back to Python as a whole.

Environment: SERVEPILOT_SIM_PURE=1 ignores any build; SERVEPILOT_SIM_FAST_DIR moves the
cache (default: $XDG_CACHE_HOME/servepilot/sim-fast, else ~/.cache/servepilot/sim-fast).
Only the standard library is imported here: it runs before the rest of the package.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

COMPILED = (
    "servepilot.sim.engine.request",
    "servepilot.sim.engine.steps",
    "servepilot.sim.engine.kvblocks",
    "servepilot.sim.engine.scheduler",
    "servepilot.sim.engine.replica",
    "servepilot.sim.fleet.members",
    "servepilot.sim.fleet.network",
    "servepilot.sim.fleet.traffic",
    "servepilot.sim.fleet.requests",
    "servepilot.sim.fleet.collect",
    "servepilot.sim.fleet.gateway",
    "servepilot.sim.fleet.simulator",
)
"""Modules compiled together (one mypyc group: calls between them are native)."""
GROUP = "servepilot_sim_fast"
"""The mypyc group: its shared library is the top-level module `GROUP + "__mypyc"`."""
MANIFEST = "manifest.json"
_ROOT = Path(__file__).resolve().parent.parent
"""The `servepilot` package directory."""
_KEYED = ("sim/**/*.py", "routing/**/*.py", "load/*.py", "core/*.py", "plan/costmodel.py")
"""Sources a build depends on: its own, and those it was type-checked against (mypyc bakes
in their classes' layouts and their Final constants)."""

_status = "pure Python: not checked yet"
_loaded = False
_noticed = False


def cache_dir() -> Path:
    explicit = os.environ.get("SERVEPILOT_SIM_FAST_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servepilot" / "sim-fast"


def build_key(root: Path = _ROOT) -> str:
    """A hash of the keyed sources (path and bytes) and of the interpreter's ABI."""
    digest = hashlib.sha256()
    abi = f"{sys.version}|{sys.implementation.cache_tag}|{sysconfig.get_config_var('SOABI')}"
    digest.update(abi.encode())
    paths = sorted({p for pattern in _KEYED for p in root.glob(pattern)})
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def status() -> str:
    """One line: whether the simulator runs compiled, and if not, why not."""
    return _status


def compiled() -> bool:
    return _loaded


def notice_once() -> None:
    """Say once per process, on stderr, that the simulator runs in pure Python, and why."""
    global _noticed
    if _loaded or _noticed:
        return
    _noticed = True
    sys.stderr.write(f"servepilot sim: {_status}\n")


class _Finder(importlib.abc.MetaPathFinder):
    """Serves the build's extension modules for exactly the names it holds."""

    def __init__(self, files: dict[str, Path]) -> None:
        self._files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self._files.get(fullname)
        if file is None:
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def _build_files(build: Path) -> dict[str, Path] | None:
    """The build's modules by name, when its manifest is complete and every file exists."""
    try:
        manifest = json.loads((build / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = {name: build / rel for name, rel in manifest.get("modules", {}).items()}
    wanted = set(COMPILED) | {f"{GROUP}__mypyc"}
    if set(files) != wanted or not all(f.is_file() for f in files.values()):
        return None
    return files


def install() -> None:
    """Put the build's finder first on sys.meta_path, if a build matches the sources."""
    global _status, _loaded
    if os.environ.get("SERVEPILOT_SIM_PURE"):
        _status = "pure Python (SERVEPILOT_SIM_PURE is set)"
        return
    cache = cache_dir()
    if not cache.is_dir():
        _status = "pure Python: no compiled build (`make sim-fast` builds one)"
        return
    key = build_key()
    files = _build_files(cache / key)
    if files is None:
        stale = any(cache.iterdir())
        why = "the sources changed since the last build" if stale else "no compiled build"
        _status = f"pure Python: {why} (`make sim-fast` builds one)"
        return
    shared = f"{GROUP}__mypyc"
    try:  # all or nothing: a build that cannot load leaves every module in Python
        spec = importlib.util.spec_from_file_location(shared, files[shared])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[shared] = module
    except (ImportError, OSError, AssertionError) as error:
        _status = f"pure Python: the compiled build failed to load ({error})"
        return
    sys.meta_path.insert(0, _Finder(files))
    _loaded = True
    _status = f"compiled (mypyc build {key})"


if any(name in sys.modules for name in COMPILED):  # out of order: stay consistent, in Python
    _status = "pure Python: the simulator was imported before its compiled build was found"
else:
    install()
