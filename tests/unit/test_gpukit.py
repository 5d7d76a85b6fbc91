"""The GPU bring-up kit on the CPU: pin files, the dependency check, and a whole build ->
parts -> install round trip on small wheels made here (no network, no GPU)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from servepilot.core.errors import ConfigError, ServepilotError
from servepilot.engine.gpukit import build as kit
from servepilot.engine.gpukit.deps import read_wheel_meta, unmet_requirements
from servepilot.engine.gpukit.install import main as install_main
from servepilot.engine.gpukit.pins import pin_file_path, read_pin_file

HEADER = "#: python 3.12\n#: platform manylinux_2_28_x86_64\n#: target-has torch numpy\n"


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal valid pure-Python wheel installing module `name` (pip accepts it)."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    files = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n",
        f"{dist}/METADATA": meta,
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = ""
    path = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for arcname, text in files.items():
            archive.writestr(arcname, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
            record += f"{arcname},sha256={digest.rstrip(b'=').decode()},{len(text)}\n"
        archive.writestr(f"{dist}/RECORD", record + f"{dist}/RECORD,,\n")
    return path


def pin_line(wheel: Path, name: str, version: str) -> str:
    return f"{name}=={version} --hash=sha256:{kit.sha256_file(wheel)}\n"


def test_the_shipped_pins_hold_vllm_0_22_0_with_its_published_hash() -> None:
    pins = read_pin_file(pin_file_path("0.22.0"))
    vllm = pins.pin("vllm")
    assert vllm is not None and vllm.version == "0.22.0"
    # reference/gpu-bringup.md: the wheel that served on the H200.
    assert vllm.sha256 == "c387a977e35795e8f77b009e019e69722963819c26b55e4a679e09d4279ae35d"
    assert pins.python == "3.12"
    assert {"torch", "transformers", "triton"} <= pins.target_has
    assert "flashinfer-python" in pins.omit
    # The versions the bring-up found to matter.
    wanted = {"openai": "2.54.0", "anthropic": "0.75.0", "mcp": "1.20.0", "xgrammar": "0.2.9",
              "apache-tvm-ffi": "0.1.15.post2", "nvidia-cutlass-dsl": "4.5.2"}  # fmt: skip
    assert {n: getattr(pins.pin(n), "version", None) for n in wanted} == wanted
    assert pins.pin("torch") is None  # the machine's own, never carried


def test_unknown_vllm_version_names_the_pinned_ones() -> None:
    with pytest.raises(ConfigError, match=r"no pinned wheel list for vLLM 0\.99") as err:
        pin_file_path("0.99")
    assert "0.22.0" in str(err.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("foo==1.0\n", "not a pinned wheel line"),
        ("foo==1 --hash=sha256:" + "a" * 64 + "\nFoo==2 --hash=sha256:" + "b" * 64 + "\n",
         "pinned twice"),
        ("#: omit foo\n", "needs `-- why`"),
    ],
)  # fmt: skip
def test_malformed_pin_files_name_the_problem(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "pins.txt"
    path.write_text(HEADER + body, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        read_pin_file(path)


def test_dependency_check_names_missing_and_out_of_range(tmp_path: Path) -> None:
    wheels = [
        make_wheel(tmp_path, "app", "1.0", ("lib>=2", "gone", "torch==9", "numpy",
                                            "winonly; sys_platform == 'win32'", "skip")),
        make_wheel(tmp_path, "lib", "1.5"),
    ]  # fmt: skip
    path = tmp_path / "pins.txt"
    path.write_text(HEADER + "#: omit skip -- not needed\n", encoding="utf-8")
    problems = unmet_requirements([read_wheel_meta(w) for w in wheels], read_pin_file(path))
    assert len(problems) == 2
    assert "app needs lib>=2, pinned 1.5" in problems[0]
    assert "app needs gone: not pinned" in problems[1]
    # An `allow` with its reason accepts the out-of-range pin.
    path.write_text(HEADER + "#: omit skip -- x\n#: allow app lib -- ran\n", encoding="utf-8")
    problems = unmet_requirements([read_wheel_meta(w) for w in wheels], read_pin_file(path))
    assert problems == ["app needs gone: not pinned, not on the target, not omitted"]


def _kit(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    out = tmp_path / "kit"
    (out / "wheels").mkdir(parents=True)
    lines = HEADER
    for name, requires in (("alpha", ("beta>=1",)), ("beta", ())):
        wheel = make_wheel(out / "wheels", name, "1.0", requires)
        lines += pin_line(wheel, name, "1.0")
    make_wheel(out / "wheels", "stale", "0.1")  # not pinned: left out of the archive
    pins_path = tmp_path / "pins.txt"
    pins_path.write_text(lines, encoding="utf-8")
    document = kit.build(read_pin_file(pins_path), out, 4096, report=lambda _m: None)
    return out, document


def test_build_splits_into_parts_with_a_manifest(tmp_path: Path) -> None:
    out, document = _kit(tmp_path)
    parts = document["parts"]
    assert isinstance(parts, list) and len(parts) >= 2
    assert all(p["bytes"] <= 4096 for p in parts)
    joined = b"".join((out / p["name"]).read_bytes() for p in parts)
    archive = document["archive"]
    assert isinstance(archive, dict)
    assert hashlib.sha256(joined).hexdigest() == archive["sha256"]
    assert [w["file"] for w in document["wheels"]] == [  # type: ignore[union-attr]
        "alpha-1.0-py3-none-any.whl", "beta-1.0-py3-none-any.whl"]  # fmt: skip
    assert json.loads((out / "manifest.json").read_text()) == document
    assert (out / "install.py").read_text() == kit.INSTALLER.read_text()


def test_build_refuses_a_wheel_whose_hash_differs(tmp_path: Path) -> None:
    out = tmp_path / "kit"
    (out / "wheels").mkdir(parents=True)
    make_wheel(out / "wheels", "alpha", "1.0")
    pins_path = tmp_path / "pins.txt"
    pins_path.write_text(HEADER + f"alpha==1.0 --hash=sha256:{'0' * 64}\n", encoding="utf-8")
    with pytest.raises(ServepilotError, match=r"sha256 .* but pins\.txt records 0000"):
        kit.pinned_wheels(read_pin_file(pins_path), out / "wheels")


def test_install_gathers_parts_one_call_at_a_time_then_installs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, document = _kit(tmp_path)
    parts = [p["name"] for p in document["parts"]]  # type: ignore[union-attr]
    stash, target = tmp_path / "stash", tmp_path / "site"
    for index, name in enumerate(parts):
        carried = tmp_path / f"call{index}"  # what one device call carries
        carried.mkdir()
        for file in (name, "manifest.json", "install.py"):
            (carried / file).write_bytes((out / file).read_bytes())
        args = [str(carried / "install.py"), "--stash", str(stash), "--target", str(target)]
        result = subprocess.run([sys.executable, *args, "--no-check"],
                                capture_output=True, text=True, check=False)  # fmt: skip
        assert result.returncode == 0, result.stderr
        if index < len(parts) - 1:
            assert f"have {index + 1} of {len(parts)} parts" in result.stdout
    assert "export PYTHONPATH=" + str(target) in result.stdout
    assert (target / "alpha" / "__init__.py").is_file() and (target / "beta").is_dir()
    # A rerun (here: from the stash alone) finds the same archive installed and does nothing.
    assert install_main(["--stash", str(stash), "--target", str(target), "--no-check"]) == 0
    assert "already installed" in capsys.readouterr().out


def test_install_refuses_a_corrupt_part(tmp_path: Path) -> None:
    out, _document = _kit(tmp_path)
    (out / "part01").write_bytes(b"x" + (out / "part01").read_bytes()[1:])
    result = subprocess.run(
        [sys.executable, str(out / "install.py"), "--stash", str(tmp_path / "s"),
         "--target", str(tmp_path / "t"), "--no-check"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    assert "part01 is corrupt" in result.stderr
