"""Build a group of compiled modules (`make sim-fast`, `make gateway-fast`) into its cache.

    python -m servepilot.core.accel_build sim|gateway [--force] [--or-pure]

mypyc on the group's modules (core/accel.py). Compiles in a temporary directory (nothing
lands next to the sources, where Python would load it whatever its age), then moves the
extension modules into `cache_dir(group)/<build_key>` in one rename, with a manifest; older
builds are removed. Needs mypy (the dev extra) and a C compiler; a minute or two on two
cores. `--or-pure`: a build that fails says so in one line and exits 0 (the group then runs
in pure Python), for `make install`, which must not fail for want of a compiler.
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

from servepilot.core.accel import GROUPS, MANIFEST, Group, build_key, cache_dir

_ROOT = Path(__file__).resolve().parent.parent.parent
"""The checkout: mypyc names modules by their paths from here."""
_SETUP = """
import sys
from setuptools import setup
from mypyc.build import mypycify

paths, target, lib, temp = sys.argv[1].split(","), sys.argv[2], sys.argv[3], sys.argv[4]
setup(
    name="servepilot-{name}-fast",
    ext_modules=mypycify(paths, opt_level="3", group_name={library!r}, target_dir=target,
                         multi_file={multi_file}),
    packages=[],
    py_modules=[],
    script_args=["build_ext", "--build-lib", lib, "--build-temp", temp],
)
"""


class BuildFailed(Exception):
    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output
        """The end of the compilers' output."""


def build(group: Group, force: bool = False) -> Path:
    """Compile, unless a build for the current sources exists; returns its directory."""
    key = build_key(group)
    cache = cache_dir(group)
    final = cache / key
    if (final / MANIFEST).is_file() and not force:
        print(f"{group.make_target}: up to date ({final})")
        return final
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{group.make_target}-", dir=cache) as work:
        lib = _compile(group, Path(work))
        staged = Path(work) / key
        staged.mkdir()
        modules = {}
        for name in [*group.modules, f"{group.library}__mypyc"]:
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
    print(f"{group.make_target}: built {len(group.modules)} modules into {final}")
    return final


def _compile(group: Group, work: Path) -> Path:
    """mypyc and the C compiler, in `work`; the folder of the built extension modules."""
    lib = work / "lib"
    paths = ",".join(name.replace(".", "/") + ".py" for name in group.modules)
    setup = _SETUP.format(
        name=group.name, library=group.library, multi_file=group.c_file_per_module
    )
    command = [sys.executable, "-c", setup, paths, str(work / "c"), str(lib), str(work / "t")]
    try:
        done = subprocess.run(command, cwd=_ROOT, capture_output=True, text=True)
    except OSError as error:
        raise BuildFailed(f"{group.make_target}: cannot run the build ({error})") from None
    if done.returncode:
        output = done.stdout[-4000:] + done.stderr[-4000:]
        raise BuildFailed(f"{group.make_target}: mypyc failed (exit {done.returncode})", output)
    return lib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("group", choices=[group.name for group in GROUPS])
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    parser.add_argument(
        "--or-pure", action="store_true", help="on failure, say so in one line and exit 0"
    )
    args = parser.parse_args()
    group = next(group for group in GROUPS if group.name == args.group)
    try:
        build(group, args.force)
    except BuildFailed as error:
        if not args.or_pure:
            sys.stderr.write(error.output)
            raise SystemExit(str(error)) from None
        print(f"{error}; {group.name} runs in pure Python (`make {group.make_target}` retries)")


if __name__ == "__main__":
    main()
