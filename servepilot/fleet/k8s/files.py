"""The rendered manifests as files, as `servepilot k8s render --out DIR` writes them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from servepilot.core.errors import ConfigError
from servepilot.fleet.k8s.render import FILE_NAMES, ManifestFile


def write_files(files: Sequence[ManifestFile], out: Path) -> None:
    """The manifests in the folder `out` (created), without an earlier render's files that
    this one does not write (another runtime's)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    for manifest in files:
        (out / manifest.name).write_text(manifest.text(), encoding="utf-8")
    for stale in sorted(set(FILE_NAMES) - {manifest.name for manifest in files}):
        (out / stale).unlink(missing_ok=True)
