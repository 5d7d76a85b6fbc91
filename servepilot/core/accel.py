"""Compiled hot paths: loads a mypyc build of a group of modules when one matches its sources.

Why: a fleet simulation spends its time in a few modules (the scheduler, the block pool, the
fleet loop, the simulated gateway), and the gateway's CPU per request in a few others (the
HTTP/1.1 server core, the upstream connection, the relay, admission, the proxy); compiled
with mypyc they run faster. The Python sources stay the source of truth: `python -m
servepilot.core.accel_build GROUP` (`make sim-fast`, `make gateway-fast`) compiles a group's
`modules` into a cache directory named by `build_key`, a hash of every source the compiled
code was built against and of the Python build. A stale build is never loaded: when a source
changes, so does the key, and the modules are imported from their Python sources again
(`status(group)` says why).

How: the package's __init__ installs one finder for every group before any module of ours is
imported, so a module is either compiled everywhere in a process or nowhere. A group is
decided the first time one of its modules is imported (or `status` asks): its build's shared
library is loaded then, up front, so that a build that cannot load falls back to Python as a
whole. Until then nothing is hashed: a process that never imports the gateway pays nothing.

Environment, per group NAME (SIM, GATEWAY): SERVEPILOT_NAME_PURE=1 ignores any build (0 or
empty reads as unset); SERVEPILOT_NAME_FAST_DIR moves its cache (default:
$XDG_CACHE_HOME/servepilot/name-fast, else ~/.cache/servepilot/name-fast). Only the standard
library is imported here: it runs before the rest of the package.
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
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

MANIFEST = "manifest.json"
_ROOT = Path(__file__).resolve().parent.parent
"""The `servepilot` package directory."""


@dataclass(frozen=True)
class Group:
    """Modules compiled together (one mypyc group: calls between them are native)."""

    name: str
    modules: tuple[str, ...]
    keyed: tuple[str, ...]
    """Globs (under servepilot/) of the sources a build depends on: its own, and those it
    was type-checked against (mypyc bakes in their classes' layouts and Final constants)."""
    c_file_per_module: bool = False
    """mypyc's multi_file: one C file per module instead of one for the group (for the
    gateway's 33 modules: a build of 52 s instead of 76 s, its CPU per request the same
    within the noise)."""

    @property
    def library(self) -> str:
        """The group's shared library is the top-level module `library + "__mypyc"`."""
        return f"servepilot_{self.name}_fast"

    @property
    def make_target(self) -> str:
        return f"{self.name}-fast"

    def env(self, what: str) -> str:
        return f"SERVEPILOT_{self.name.upper()}_{what}"


SIM = Group(
    "sim",
    (
        "servepilot.sim.engine.request",
        "servepilot.sim.engine.steps",
        "servepilot.sim.engine.kvblocks",
        "servepilot.sim.engine.chainevents",
        "servepilot.sim.engine.sharing",
        "servepilot.sim.engine.steptime",
        "servepilot.sim.engine.scheduler",
        "servepilot.sim.engine.replica",
        "servepilot.sim.engine.hostclock",
        "servepilot.sim.fleet.members",
        "servepilot.sim.fleet.intake",
        "servepilot.sim.fleet.network",
        "servepilot.sim.fleet.kvevents",
        "servepilot.sim.fleet.traffic",
        "servepilot.sim.fleet.requests",
        "servepilot.sim.fleet.clients",
        "servepilot.sim.fleet.collect",
        "servepilot.sim.fleet.gateway",
        "servepilot.sim.fleet.replicas",
        "servepilot.sim.fleet.simulator",
    ),
    (
        "sim/**/*.py",
        "routing/**/*.py",
        "load/*.py",
        "core/**/*.py",
        "plan/costmodel.py",
        "plan/step_latency.py",
    ),
)
GATEWAY = Group(
    "gateway",
    (
        "servepilot.http1.request",
        "servepilot.http1.connection",
        "servepilot.http1.server",
        "servepilot.http1.client",
        "servepilot.gateway.upstream",
        "servepilot.gateway.relay",
        "servepilot.gateway.deadlines",
        "servepilot.gateway.dispatch",
        "servepilot.gateway.proxy",
        "servepilot.gateway.series",
        "servepilot.gateway.metrics",
        "servepilot.gateway.validation",
        "servepilot.gateway.replica",
        "servepilot.gateway.app",
        "servepilot.gateway.pool",
        "servepilot.routing.round_robin",
        "servepilot.routing.least_load",
        "servepilot.routing.bounded_load",
        "servepilot.routing.hybrid",
        "servepilot.routing.prefix",
        "servepilot.routing.prefix_affinity",
        "servepilot.routing.prefix_table",
        "servepilot.routing.session",
        "servepilot.routing.length_shard",
        "servepilot.routing.admission.budget",
        "servepilot.routing.admission.meter",
        "servepilot.routing.admission.ratelimit",
        "servepilot.routing.admission.limits",
        "servepilot.routing.admission.breaker",
        "servepilot.routing.admission.decision",
        "servepilot.routing.admission.fair",
        "servepilot.routing.admission.queue",
        "servepilot.routing.admission.driver",
    ),
    ("gateway/**/*.py", "http1/*.py", "routing/**/*.py", "core/**/*.py", "engine/*.py"),
    c_file_per_module=True,
)
GROUPS = (SIM, GATEWAY)


@dataclass(frozen=True)
class _Decision:
    files: dict[str, Path] | None
    """The build's modules by name; None: the group runs in Python."""
    status: str


_decided: dict[str, _Decision] = {}
_noticed: set[str] = set()


def cache_dir(group: Group) -> Path:
    explicit = os.environ.get(group.env("FAST_DIR"))
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "servepilot" / group.make_target


def build_key(group: Group, root: Path = _ROOT) -> str:
    """A hash of the group's keyed sources (path and bytes) and of the interpreter's ABI."""
    digest = hashlib.sha256()
    abi = f"{sys.version}|{sys.implementation.cache_tag}|{sysconfig.get_config_var('SOABI')}"
    digest.update(abi.encode())
    paths = sorted({p for pattern in group.keyed for p in root.glob(pattern)})
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def status(group: Group) -> str:
    """One line: whether the group runs compiled, and if not, why not."""
    return _decide(group).status


def compiled(group: Group) -> bool:
    return _decide(group).files is not None


def notice_once(group: Group, what: str) -> None:
    """Say once per process, on stderr, that `what` runs in pure Python, and why."""
    if compiled(group) or group.name in _noticed:
        return
    _noticed.add(group.name)
    sys.stderr.write(f"{what}: {status(group)}\n")


def _decide(group: Group) -> _Decision:
    decision = _decided.get(group.name)
    if decision is None:
        decision = _decided[group.name] = _load(group)
    return decision


def _build_files(group: Group, build: Path) -> dict[str, Path] | None:
    """The build's modules by name, when its manifest is complete and every file exists."""
    try:
        manifest = json.loads((build / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = {name: build / rel for name, rel in manifest.get("modules", {}).items()}
    wanted = set(group.modules) | {f"{group.library}__mypyc"}
    if set(files) != wanted or not all(f.is_file() for f in files.values()):
        return None
    return files


def _load(group: Group) -> _Decision:
    """Find the group's build for the current sources and load its shared library."""
    builds = f"`make {group.make_target}` builds one"
    if os.environ.get(group.env("PURE"), "") not in ("", "0"):
        return _Decision(None, f"pure Python ({group.env('PURE')} is set)")
    cache = cache_dir(group)
    if not cache.is_dir():
        return _Decision(None, f"pure Python: no compiled build ({builds})")
    key = build_key(group)
    files = _build_files(group, cache / key)
    if files is None:
        stale = any(cache.iterdir())
        why = "the sources changed since the last build" if stale else "no compiled build"
        return _Decision(None, f"pure Python: {why} ({builds})")
    shared = f"{group.library}__mypyc"
    try:  # all or nothing: a build that cannot load leaves every module in Python
        spec = importlib.util.spec_from_file_location(shared, files[shared])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[shared] = module
    except (ImportError, OSError, AssertionError) as error:
        return _Decision(None, f"pure Python: the compiled build failed to load ({error})")
    return _Decision(files, f"compiled (mypyc build {key})")


class _Finder(importlib.abc.MetaPathFinder):
    """Serves a group's extension modules for exactly the names it holds, once the group is
    decided compiled; every other name goes on to the usual finders."""

    def __init__(self) -> None:
        self._groups = {name: group for group in GROUPS for name in group.modules}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        group = self._groups.get(fullname)
        if group is None:
            return None
        files = _decide(group).files
        if files is None:
            return None
        return importlib.util.spec_from_file_location(fullname, files[fullname])


def install() -> None:
    """Put the finder first on sys.meta_path (once; before any grouped module is imported)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
