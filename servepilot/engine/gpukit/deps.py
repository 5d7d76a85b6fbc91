"""Check that a set of wheels, with the target's own packages, satisfies its requirements.

`pip install --no-deps` on the target checks nothing, so a missing or mismatched dependency
would first show as an ImportError minutes into a paid GPU call. This reads each wheel's
METADATA here and names every requirement that is neither pinned, held by the target, nor
deliberately left out (`#: omit`), and every pinned version outside a declared range that the
pin file does not `#: allow`.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from servepilot.engine.gpukit.pins import PinFile, canonical


@dataclass(frozen=True, slots=True)
class WheelMeta:
    name: str
    version: str
    requires: tuple[str, ...]


def read_wheel_meta(wheel: Path) -> WheelMeta:
    """Name, version and Requires-Dist of `wheel`, from its .dist-info/METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        entries = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        if len(entries) != 1:
            raise ValueError(f"{wheel.name}: expected one .dist-info/METADATA, found {entries}")
        text = archive.read(entries[0]).decode("utf-8")
    headers = HeaderParser().parsestr(text)
    return WheelMeta(
        name=str(headers["Name"]),
        version=str(headers["Version"]),
        requires=tuple(str(r) for r in headers.get_all("Requires-Dist", [])),
    )


def marker_env(python: str) -> dict[str, str]:
    """The environment markers of a manylinux x86-64 CPython `python` target."""
    return {
        "python_version": python,
        "python_full_version": f"{python}.0",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "extra": "",
    }


def unmet_requirements(wheels: list[WheelMeta], pins: PinFile) -> list[str]:
    """One line per problem, empty when the set is complete and consistent."""
    have = {canonical(w.name): Version(w.version) for w in wheels}
    env = marker_env(pins.python)
    problems = []
    for wheel in sorted(wheels, key=lambda w: canonical(w.name)):
        owner = canonical(wheel.name)
        for text in wheel.requires:
            try:
                req = Requirement(text)
            except InvalidRequirement as exc:
                problems.append(f"{wheel.name}: unreadable requirement {text!r} ({exc})")
                continue
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            problems += _check(owner, wheel.name, req, have, pins)
    return problems


def _check(
    owner: str, label: str, req: Requirement, have: dict[str, Version], pins: PinFile
) -> list[str]:
    name = canonical(req.name)
    if name in have:
        ok = req.specifier.contains(have[name], prereleases=True)
        if ok or (owner, name) in pins.allow:
            return []
        return [f"{label} needs {req}, pinned {have[name]} (add `#: allow {owner} {name} -- why`)"]
    if name in pins.target_has or name in pins.omit:
        return []
    return [f"{label} needs {req}: not pinned, not on the target, not omitted"]
