"""Build the wheelhouse of a pin file and split it into parts: `python -m servepilot.engine.gpukit`.

Into OUT (default `.gpukit/`, ignored by git): `wheels/` (the downloaded wheels, reused by the
next build, so a rebuild needs no network), `partNN` (the wheels as one tar archive, cut into
pieces of at most --part-mib), `manifest.json` (the parts' and wheels' sizes and sha256) and
`install.py` (the target's side: reassemble, verify, install). Nothing here touches a GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from servepilot.core.errors import ConfigError, ServepilotError
from servepilot.engine.gpukit.deps import read_wheel_meta, unmet_requirements
from servepilot.engine.gpukit.pins import Pin, PinFile, pin_file_path, read_pin_file

DEFAULT_VLLM = "0.22.0"
# The lent machine takes at most 64 MiB per call, the repository's own files included: 24 MiB
# with the recorded GPU runs late on 2026-12-06, when a 42 MiB part was refused (a 50 MiB one
# had been at 14 MiB); 33 MiB with the eleventh loan's token arrivals (2026-12-07). 26 MiB
# leaves about 4 MiB for the tree to grow; past that, lower it.
DEFAULT_PART_MIB = 26
MANIFEST_FORMAT = 1
INSTALLER = Path(__file__).with_name("install.py")

Report = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    size: int
    sha256: str


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def download(pins: PinFile, wheels: Path, report: Report) -> None:
    """`pip download` exactly the pinned wheels; pip itself refuses a hash mismatch."""
    if all(_present(pin, wheels) for pin in pins.pins):
        report(f"all {len(pins.pins)} wheels already in {wheels}: nothing to download")
        return
    platforms = [arg for p in pins.platforms for arg in ("--platform", p)]
    argv = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--python-version", pins.python, "--implementation", "cp",
        *platforms, "--require-hashes", "-r", str(pins.path), "-d", str(wheels),
    ]  # fmt: skip
    report(f"downloading {len(pins.pins)} wheels into {wheels}")
    result = subprocess.run(argv, check=False)
    if result.returncode != 0:
        raise ServepilotError(
            f"pip download of {pins.path.name} failed (exit {result.returncode})",
            hint="needs access to PyPI here; a hash mismatch means the file on the index "
            "changed: check it before updating the pin",
        )


def pinned_wheels(pins: PinFile, wheels: Path) -> list[Path]:
    """The one wheel file per pin in `wheels`, each checked against its recorded sha256."""
    files = []
    for pin in pins.pins:
        matches = _matching(pin, wheels)
        if len(matches) != 1:
            found = ", ".join(m.name for m in matches) or "none"
            raise ServepilotError(f"{wheels}: expected one wheel of {pin.name}=={pin.version}, "
                                  f"found {found}")  # fmt: skip
        actual = sha256_file(matches[0])
        if actual != pin.sha256:
            raise ServepilotError(
                f"{matches[0]}: sha256 {actual}, but {pins.path.name} records {pin.sha256}",
                hint=f"delete it and build again; if it persists, the index changed {pin.name}",
            )
        files.append(matches[0])
    return files


def _matching(pin: Pin, wheels: Path) -> list[Path]:
    out = []
    for path in sorted(wheels.glob("*.whl")):
        try:
            name, version, _build, _tags = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if name == canonicalize_name(pin.name) and str(version) == pin.version:
            out.append(path)
    return out


def _present(pin: Pin, wheels: Path) -> bool:
    matches = _matching(pin, wheels) if wheels.is_dir() else []
    return len(matches) == 1 and sha256_file(matches[0]) == pin.sha256


def check_dependencies(pins: PinFile, files: list[Path]) -> None:
    problems = unmet_requirements([read_wheel_meta(f) for f in files], pins)
    if problems:
        raise ConfigError(
            f"the wheels of {pins.path.name} leave requirements unmet:\n  " + "\n  ".join(problems),
            hint="pin the missing wheels, or record `#: omit`/`#: allow` with the reason",
        )


def write_archive(files: Iterable[Path], archive: Path) -> None:
    """One uncompressed tar (wheels are zip files already), reproducible: fixed order, no
    owners, no times."""
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(files, key=lambda p: p.name):
            info = tarfile.TarInfo(f"wheels/{path.name}")
            info.size = path.stat().st_size
            info.mode = 0o644
            with path.open("rb") as handle:
                tar.addfile(info, handle)


def split(archive: Path, out: Path, part_bytes: int) -> list[Part]:
    """Cut `archive` into out/part01, part02, ... of at most `part_bytes` each."""
    for stale in out.glob("part[0-9][0-9]"):
        stale.unlink()
    parts: list[Part] = []
    with archive.open("rb") as source:
        while chunk := source.read(part_bytes):
            name = f"part{len(parts) + 1:02d}"
            (out / name).write_bytes(chunk)
            parts.append(Part(name, len(chunk), hashlib.sha256(chunk).hexdigest()))
    if len(parts) > 99:
        raise ConfigError(
            f"{len(parts)} parts: more than the 99 names allow", hint="raise --part-mib"
        )
    return parts


def manifest(
    pins: PinFile, files: list[Path], parts: list[Part], archive: Path
) -> dict[str, object]:
    return {
        "format": MANIFEST_FORMAT,
        "pin_file": pins.path.name,
        "python": pins.python,
        "archive": {"bytes": archive.stat().st_size, "sha256": sha256_file(archive)},
        "parts": [{"name": p.name, "bytes": p.size, "sha256": p.sha256} for p in parts],
        "wheels": [
            {"file": f.name, "bytes": f.stat().st_size, "sha256": sha256_file(f)} for f in files
        ],
    }


def build(pins: PinFile, out: Path, part_bytes: int, report: Report) -> dict[str, object]:
    """Download (or reuse), verify, check, archive and split; returns the manifest."""
    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    download(pins, wheels, report)
    files = pinned_wheels(pins, wheels)
    report(f"{len(files)} wheels match their recorded sha256")
    check_dependencies(pins, files)
    report("every requirement is pinned, on the target, or omitted on purpose")
    archive = out / "wheelhouse.tar"
    write_archive(files, archive)
    parts = split(archive, out, part_bytes)
    document = manifest(pins, files, parts, archive)
    archive.unlink()  # the parts hold it; half the disk
    (out / "manifest.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    shutil.copyfile(INSTALLER, out / "install.py")
    return document


def summary(document: dict[str, object], out: Path) -> str:
    parts = document["parts"]
    assert isinstance(parts, list)
    lines = io.StringIO()
    print(f"wheelhouse of {document['pin_file']} in {out}/: {len(parts)} parts", file=lines)
    for part in parts:
        size = f"{part['bytes'] / 2**20:6.1f} MiB"
        print(f"  {out}/{part['name']}  {size}  sha256 {part['sha256'][:16]}...", file=lines)
    print(f"  {out}/manifest.json, {out}/install.py", file=lines)
    print("next: docs/gpu.md (one device call per part; each runs install.py)", file=lines)
    return lines.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m servepilot.engine.gpukit", description=__doc__)
    parser.add_argument("--vllm", default=DEFAULT_VLLM, help="the vLLM version whose pins to build")
    parser.add_argument("--out", type=Path, default=Path(".gpukit"), help="output folder")
    parser.add_argument("--part-mib", type=int, default=DEFAULT_PART_MIB, help="largest part, MiB")
    args = parser.parse_args(argv)
    if args.part_mib < 1:
        parser.error("--part-mib must be at least 1")
    try:
        pins = read_pin_file(pin_file_path(args.vllm))
        document = build(pins, args.out, args.part_mib * 2**20, report=print)
    except ServepilotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(summary(document, args.out), end="")
    return 0
