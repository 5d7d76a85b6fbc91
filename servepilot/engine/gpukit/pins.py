"""Read a pin file: requirement lines with hashes, plus the kit's `#:` directives.

The file is a valid pip requirements file (`pip download --require-hashes -r` reads it as it
is); the directives ride in comments so pip ignores them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from servepilot.core.errors import ConfigError

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\s+--hash=sha256:([0-9a-f]{64})$")
_REASONED = re.compile(r"^(\S+(?:\s+\S+)?)\s+--\s+(.+)$")


def canonical(name: str) -> str:
    """PEP 503's normalised name: `Foo_Bar.baz` and `foo-bar-baz` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True)
class Pin:
    name: str
    version: str
    sha256: str


@dataclass(frozen=True, slots=True)
class PinFile:
    path: Path
    pins: tuple[Pin, ...]
    python: str
    platforms: tuple[str, ...]
    target_has: frozenset[str] = field(default_factory=frozenset)
    omit: dict[str, str] = field(default_factory=dict)
    """requirement name -> why it is not brought."""
    allow: dict[tuple[str, str], str] = field(default_factory=dict)
    """(package, requirement) -> why a pin outside the package's declared range is fine."""

    def pin(self, name: str) -> Pin | None:
        key = canonical(name)
        return next((p for p in self.pins if canonical(p.name) == key), None)


def pin_file_path(vllm_version: str) -> Path:
    """The shipped pin file for `vllm_version`; a clear error names the versions there are."""
    folder = Path(str(resources.files(__package__ or "servepilot.engine.gpukit") / "pins"))
    path = folder / f"vllm-{vllm_version}.txt"
    if not path.is_file():
        known = sorted(p.stem.removeprefix("vllm-") for p in folder.glob("vllm-*.txt"))
        raise ConfigError(
            f"no pinned wheel list for vLLM {vllm_version} ({path} does not exist)",
            hint=f"pinned versions: {', '.join(known) or 'none'}",
        )
    return path


def read_pin_file(path: Path) -> PinFile:
    """Parse `path`; every malformed line is an error naming the file and line."""
    pins: list[Pin] = []
    directives: dict[str, list[str]] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        where = f"{path}:{number}"
        if line.startswith("#:"):
            key, _, rest = line[2:].strip().partition(" ")
            directives.setdefault(key, []).append(rest.strip())
        elif line and not line.startswith("#"):
            pins.append(_parse_pin(line, where))
    _check_unique(pins, path)
    return PinFile(
        path=path,
        pins=tuple(pins),
        python=_single(directives, "python", path),
        platforms=tuple(" ".join(directives.get("platform", [])).split()),
        target_has=frozenset(
            canonical(n) for n in " ".join(directives.get("target-has", [])).split()
        ),
        omit={canonical(k): why for k, why in _reasoned(directives.get("omit", []), path)},
        allow={_pair(k, path): why for k, why in _reasoned(directives.get("allow", []), path)},
    )


def _parse_pin(line: str, where: str) -> Pin:
    match = _PIN.match(line)
    if match is None:
        raise ConfigError(
            f"{where}: not a pinned wheel line: {line!r}",
            hint="write NAME==VERSION --hash=sha256:<64 hex digits>",
        )
    return Pin(name=match[1], version=match[2], sha256=match[3])


def _check_unique(pins: list[Pin], path: Path) -> None:
    # Two versions of one package stop the whole `pip install --no-deps` on the target.
    seen: dict[str, Pin] = {}
    for pin in pins:
        other = seen.setdefault(canonical(pin.name), pin)
        if other is not pin:
            raise ConfigError(
                f"{path}: {pin.name} is pinned twice ({other.version} and {pin.version})",
                hint="keep one version of each package",
            )


def _single(directives: dict[str, list[str]], key: str, path: Path) -> str:
    values = directives.get(key, [])
    if len(values) != 1 or not values[0]:
        raise ConfigError(f"{path}: needs exactly one `#: {key} ...` line")
    return values[0]


def _reasoned(values: list[str], path: Path) -> list[tuple[str, str]]:
    out = []
    for value in values:
        match = _REASONED.match(value)
        if match is None:
            raise ConfigError(f"{path}: `#: {value}` needs `-- why` after the name")
        out.append((match[1], match[2]))
    return out


def _pair(key: str, path: Path) -> tuple[str, str]:
    parts = key.split()
    if len(parts) != 2:
        raise ConfigError(f"{path}: `#: allow {key}` needs a package and a requirement")
    return canonical(parts[0]), canonical(parts[1])
