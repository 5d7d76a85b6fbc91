"""Build the compiled simulator core (`make sim-fast`): mypyc on accel.COMPILED, into the cache.

    python -m servepilot.sim.accel_build [--force]

Compiles in a temporary directory (nothing lands next to the sources, where Python would
load it whatever its age), then moves the extension modules into `cache_dir()/<build_key>`
in one rename, with a manifest; older builds are removed. Needs mypy (the dev extra) and a
C compiler; about a minute and a half on two cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from servepilot.sim.accel import COMPILED, GROUP, MANIFEST, build_key, cache_dir

_ROOT = Path(__file__).resolve().parent.parent.parent
"""The checkout: mypyc names modules by their paths from here."""
_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify

paths, target, lib, temp = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
setup(
    name="servepilot-sim-fast",
    ext_modules=mypycify(paths, opt_level="3", group_name={group!r}, target_dir=target),
    packages=[],
    py_modules=[],
    script_args=["build_ext", "--build-lib", lib, "--build-temp", temp],
)
"""


def build(force: bool = False) -> Path:
    """Compile, unless a build for the current sources exists; returns its directory."""
    key = build_key()
    cache = cache_dir()
    final = cache / key
    if (final / MANIFEST).is_file() and not force:
        print(f"sim-fast: up to date ({final})")
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sim-fast-", dir=cache) as work:
        lib = Path(work) / "lib"
        paths = ",".join(name.replace(".", "/") + ".py" for name in COMPILED)
        command = [sys.executable, "-c", _SETUP.format(group=GROUP), paths]
        command += [str(Path(work) / "c"), str(lib), str(Path(work) / "temp")]
        done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True)
        if done.returncode:
            sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
            raise SystemExit(f"sim-fast: mypyc failed (exit {done.returncode})")
        staged = Path(work) / key
        staged.mkdir()
        modules = {}
        for name in [*COMPILED, f"{GROUP}__mypyc"]:
            parts = name.split(".")
            (found,) = (lib / Path(*parts[:-1])).glob(f"{parts[-1]}.*.so")
            target = staged / found.name if len(parts) == 1 else staged / f"{name}.so"
            shutil.copy2(found, target)
            modules[name] = target.name
        (staged / MANIFEST).write_text(json.dumps({"key": key, "modules": modules}, indent=1))
        for old in cache.iterdir():
            if old.name != Path(work).name and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        os.replace(staged, final)
    print(f"sim-fast: built {len(COMPILED)} modules into {final}")
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    build(parser.parse_args().force)


if __name__ == "__main__":
    main()
