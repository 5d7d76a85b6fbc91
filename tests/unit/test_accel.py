"""The compiled builds' loader (core/accel.py) and builder (core/accel_build.py), for both of
its groups: keyed by their sources, never loaded stale or half, each decided apart, and a
failed build that falls back to Python in one line; with a gateway build present, the
compiled gateway answers what the Python one does (the gateway's own tests run both ways:
with the build in the cache, and with SERVEPILOT_GATEWAY_PURE=1)."""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from servepilot.core import accel, accel_build

ROOT = Path(__file__).resolve().parents[2]
KEYED = {
    "sim": ("sim/engine/scheduler.py", "routing/least_load.py", "load/slots.py",
            "plan/costmodel.py"),
    "gateway": ("gateway/relay.py", "http1/connection.py", "routing/round_robin.py",
                "core/config/gateway.py", "engine/metrics.py"),
}  # fmt: skip
GROUPS = {group.name: group for group in accel.GROUPS}


@pytest.mark.parametrize("name", sorted(KEYED))
def test_build_key_follows_every_keyed_source(tmp_path: Path, name: str) -> None:
    group = GROUPS[name]
    root = tmp_path / "servepilot"
    shutil.copytree(ROOT / "servepilot", root, ignore=shutil.ignore_patterns("__pycache__"))
    key = accel.build_key(group, root)
    assert key == accel.build_key(group, root)
    for source in KEYED[name]:
        path = root / source
        text = path.read_text()
        path.write_text(text + "\n# changed\n")
        assert accel.build_key(group, root) != key, source
        path.write_text(text)
    (root / "cli" / "main.py").write_text("# not something either build depends on\n")
    assert accel.build_key(group, root) == key


def _fresh_process(code: str, env: dict[str, str]) -> str:
    inherited = {k: v for k, v in os.environ.items() if not k.endswith("_PURE")}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=inherited | env, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


def _status_in_fresh_process(name: str, env: dict[str, str]) -> str:
    code = f"from servepilot.core import accel; print(accel.status(accel.{name.upper()}))"
    return _fresh_process(code, env)


@pytest.mark.parametrize("name", sorted(KEYED))
def test_without_a_matching_build_it_runs_in_python_and_says_why(tmp_path: Path, name: str) -> None:
    group = GROUPS[name]
    cache = tmp_path / "cache"
    env = {group.env("FAST_DIR"): str(cache)}
    assert "no compiled build" in _status_in_fresh_process(name, env)
    assert f"`make {name}-fast`" in _status_in_fresh_process(name, env)
    stale = cache / "0123456789abcdef01234567"
    stale.mkdir(parents=True)
    (stale / accel.MANIFEST).write_text(json.dumps({"modules": {}}))
    assert "sources changed" in _status_in_fresh_process(name, env)
    # A build under the current key with a file missing is incomplete: not loaded either.
    current = cache / accel.build_key(group)
    current.mkdir()
    modules = {m: f"{m}.so" for m in group.modules}
    modules[f"{group.library}__mypyc"] = "group.so"
    (current / accel.MANIFEST).write_text(json.dumps({"modules": modules}))
    assert _status_in_fresh_process(name, env).startswith("pure Python")
    env[group.env("PURE")] = "1"
    assert f"SERVEPILOT_{name.upper()}_PURE" in _status_in_fresh_process(name, env)
    env[group.env("PURE")] = "0"  # off, as a user who writes 0 means
    assert "is set" not in _status_in_fresh_process(name, env)


def test_the_groups_are_decided_apart_and_only_when_used(tmp_path: Path) -> None:
    """Importing the package hashes nothing; the simulator's engine decides its group alone,
    so a gateway without a build does not touch the simulator's (and the other way). The
    routing policies are the gateway group's: a simulation that routes uses them compiled."""
    code = (
        "import servepilot.core.accel as a, servepilot; d0 = sorted(a._decided); "
        "import servepilot.sim.engine.replica; d1 = sorted(a._decided); "
        "import servepilot.routing; print(d0, d1, sorted(a._decided))"
    )
    env = {"SERVEPILOT_SIM_FAST_DIR": str(tmp_path / "sim")}
    assert _fresh_process(code, env) == "[] ['sim'] ['gateway', 'sim']"
    code = "import servepilot.core.accel as a, servepilot.http1; print(sorted(a._decided))"
    assert _fresh_process(code, {"SERVEPILOT_GATEWAY_PURE": "1"}) == "['gateway']"


def test_a_failed_build_with_or_pure_says_so_in_one_line_and_exits_0(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def fail(group: accel.Group, work: Path) -> Path:
        raise accel_build.BuildFailed("gateway-fast: mypyc failed (exit 1)", "gcc: not found\n")

    monkeypatch.setenv("SERVEPILOT_GATEWAY_FAST_DIR", str(tmp_path))
    monkeypatch.setattr(accel_build, "_compile", fail)
    monkeypatch.setattr(sys, "argv", ["accel_build", "gateway", "--or-pure"])
    accel_build.main()
    out, err = capsys.readouterr()
    assert out.splitlines() == [
        "gateway-fast: mypyc failed (exit 1); gateway runs in pure Python "
        "(`make gateway-fast` retries)"
    ]
    assert err == ""
    monkeypatch.setattr(sys, "argv", ["accel_build", "gateway"])
    with pytest.raises(SystemExit, match="mypyc failed"):
        accel_build.main()
    assert "gcc: not found" in capsys.readouterr().err


def test_servepilot_gateway_says_at_start_whether_its_data_path_is_compiled() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "SERVEPILOT_GATEWAY_PURE": "1"}
    argv = [sys.executable, "-m", "servepilot", "gateway", "--port", str(port),
            "--replica", "http://127.0.0.1:9"]  # fmt: skip
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    # A thread reads the lines: select() on the pipe cannot see a line the reader's buffer
    # already holds (both lines often come in one read), and would wait for nothing.
    arrived: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [arrived.put(line) for line in proc.stdout or ()],
                     daemon=True).start()  # fmt: skip
    lines: list[str] = []
    try:
        # Up to the data path's line, which follows the start line (a warning about the
        # unreachable replica may come first under load).
        while not any(line.startswith("gateway data path") for line in lines) and len(lines) < 10:
            try:
                lines.append(arrived.get(timeout=90))
            except queue.Empty:
                break
    finally:
        proc.terminate()
        proc.wait(30)
    said = [line.strip() for line in lines]
    assert said[-1] == "gateway data path: pure Python (SERVEPILOT_GATEWAY_PURE is set)", said
    assert any(line.startswith(f"gateway on http://127.0.0.1:{port}/v1") for line in said), said
