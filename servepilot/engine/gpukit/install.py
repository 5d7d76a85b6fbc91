"""Install a GPU wheelhouse on the target, from the parts `build` made: standard library only.

Copied beside the parts as `.gpukit/install.py`. Every call runs the same command:

    python3 .gpukit/install.py [--stash /tmp/gpukit] [--target /tmp/site]

It moves the parts found beside it into the stash folder (each checked against
manifest.json), and once the stash holds every part it reassembles the archive, checks it and
every wheel, installs them with `pip install --no-index --no-deps --no-compile --target`, imports
vLLM as a self-check and prints the environment to export. A part carried in one transfer per
call (the lent machine's limit) therefore needs nothing but the same command each time; a box
that holds all parts at once installs in one run. Exit status 0: done or waiting for parts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

MARKER = ".servepilot-gpukit.json"
# vLLM without flashinfer (the kit leaves it out) and the lent machines' NVLink rule.
ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_ATTENTION_BACKEND": "FLASH_ATTN",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
SELF_CHECK = (
    "import torch, vllm, transformers; "
    "gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'no CUDA device'; "
    "print(f'vllm {vllm.__version__}  torch {torch.__version__}  "
    "transformers {transformers.__version__}  {gpu}')"
)


class KitError(Exception):
    """A part or wheel is missing or corrupt, or pip failed."""


def sha256_file(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def load_manifest(*folders: Path) -> tuple[dict[str, Any], Path]:
    for folder in folders:
        path = folder / "manifest.json"
        if path.is_file():
            document: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            return document, path
    raise KitError(f"no manifest.json in {' or '.join(str(f) for f in folders)}")


def stash_parts(manifest: dict[str, Any], here: Path, stash: Path) -> list[str]:
    """Copy the good parts found in `here` into `stash`; the names still missing there."""
    stash.mkdir(parents=True, exist_ok=True)
    missing = []
    for part in manifest["parts"]:
        name, size, digest = part["name"], part["bytes"], part["sha256"]
        kept, carried = stash / name, here / name
        if carried.is_file() and carried.resolve() != kept.resolve():
            if carried.stat().st_size != size or sha256_file(carried) != digest:
                raise KitError(f"{carried} is corrupt (size or sha256 differ from the manifest)")
            shutil.copyfile(carried, kept)
            print(f"stashed {name} ({size / 2**20:.1f} MiB) in {stash}")
        if not (kept.is_file() and kept.stat().st_size == size):
            missing.append(name)
    return missing


def reassemble(manifest: dict[str, Any], stash: Path) -> Path:
    archive = stash / "wheelhouse.tar"
    digest = hashlib.sha256()
    with archive.open("wb") as out:
        for part in manifest["parts"]:
            data = (stash / part["name"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise KitError(f"{stash / part['name']} is corrupt; carry it again")
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != manifest["archive"]["sha256"]:
        raise KitError(f"{archive}: the reassembled archive's sha256 differs from the manifest")
    return archive


def unpack(manifest: dict[str, Any], archive: Path, stash: Path) -> list[Path]:
    with tarfile.open(archive) as tar:
        tar.extractall(stash, filter="data")
    wheels = []
    for wheel in manifest["wheels"]:
        path = stash / "wheels" / wheel["file"]
        if not path.is_file() or sha256_file(path) != wheel["sha256"]:
            raise KitError(f"{path}: missing or its sha256 differs from the manifest")
        wheels.append(path)
    return wheels


def pip_install(wheels: list[Path], target: Path) -> None:
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
            "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(target),
            *map(str, wheels)]  # fmt: skip
    if subprocess.run(argv, check=False).returncode != 0:
        raise KitError(f"pip install into {target} failed (its output is above)")


def installed(manifest: dict[str, Any], target: Path) -> bool:
    try:
        marker = json.loads((target / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(marker.get("archive_sha256") == manifest["archive"]["sha256"])


def install(manifest: dict[str, Any], stash: Path, target: Path) -> None:
    if installed(manifest, target):
        print(f"already installed in {target} (same archive)")
        return
    wheels = unpack(manifest, reassemble(manifest, stash), stash)
    print(f"installing {len(wheels)} wheels into {target}")
    pip_install(wheels, target)
    marker = {"archive_sha256": manifest["archive"]["sha256"], "pin_file": manifest["pin_file"]}
    (target / MARKER).write_text(json.dumps(marker) + "\n", encoding="utf-8")


def self_check(target: Path) -> int:
    env = {**os.environ, **ENV, "PYTHONPATH": _pythonpath(target)}
    return subprocess.run([sys.executable, "-c", SELF_CHECK], env=env, check=False).returncode


def _pythonpath(target: Path) -> str:
    rest = os.environ.get("PYTHONPATH")
    return f"{target}:{rest}" if rest else str(target)


def exports(target: Path) -> str:
    pairs = [f"PYTHONPATH={target}${{PYTHONPATH:+:$PYTHONPATH}}"]
    pairs += [f"{k}={v}" for k, v in ENV.items()]
    return "export " + " ".join(pairs)


def run(here: Path, stash: Path, target: Path, check: bool) -> int:
    manifest, found = load_manifest(here, stash)
    if found.parent != stash:
        stash.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(found, stash / "manifest.json")
    missing = stash_parts(manifest, here, stash)
    total = len(manifest["parts"])
    if missing:
        print(f"have {total - len(missing)} of {total} parts in {stash}; "
              f"still to carry: {' '.join(missing)}")  # fmt: skip
        return 0
    install(manifest, stash, target)
    status = self_check(target) if check else 0
    print(exports(target))
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stash", type=Path, default=Path("/tmp/gpukit"), help="where parts gather"
    )
    parser.add_argument(
        "--target", type=Path, default=Path("/tmp/site"), help="where wheels install"
    )
    parser.add_argument("--no-check", action="store_true", help="skip importing vLLM afterwards")
    args = parser.parse_args(argv)
    try:
        return run(Path(__file__).resolve().parent, args.stash, args.target, not args.no_check)
    except (KitError, OSError, tarfile.TarError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
