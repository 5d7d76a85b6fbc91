"""servepilot/engine/gpu/report.py: what the lead runs on a bare GPU machine (standard
library only, nvidia-smi when nvidia-ml-py is absent), on recorded nvidia-smi outputs."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from servepilot.engine.gpu import report
from servepilot.engine.gpu.inventory import GpuInventory
from servepilot.engine.gpu.nvml import NvmlProbe
from servepilot.engine.gpu.probe import NodeProbe
from servepilot.engine.gpu.smi import QUERY_ARGS, TOPOLOGY_ARGS, SmiProbe

ROOT = Path(__file__).parent.parent.parent
DATA = ROOT / "tests" / "data" / "nvidia_smi"


class NoDriver:
    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


def recorded(query: str, topology: str) -> GpuInventory:
    def run(args: Sequence[str]) -> str | None:
        name = query if tuple(args) == QUERY_ARGS else topology
        return (DATA / name).read_text() if tuple(args) in (QUERY_ARGS, TOPOLOGY_ARGS) else None

    return NodeProbe(nvml=NvmlProbe(NoDriver()), smi=SmiProbe(run)).read()


def test_one_h200_through_nvidia_smi(capsys: pytest.CaptureFixture[str]) -> None:
    inventory = recorded("query_h200_1gpu.txt", "topo_h200_1gpu.txt")
    assert report.main(lambda: inventory) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "reader: nvidia-smi; devices: 1"
    assert out[1] == ("  GPU0  NVIDIA H200  memory 0.00 / 140.40 GiB used  utilisation 0 %  NUMA 0")
    assert out[2] == "topology: not readable"
    assert out[4] == "llama-3.1-8b: 1 x TP1: r0: 0  (in order)"
    assert out[5].startswith("llama-3.1-8b: 8 x TP1: refused: the fleet needs 8 GPUs")
    assert out[5].endswith("but this node has 1")


def test_eight_nvlinked_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    row = (DATA / "query_h200_1gpu.txt").read_text().strip().partition(",")[2]
    query = "\n".join(f"{i},{row}" for i in range(8))
    topology = (DATA / "topo_h100_nv18_2numa.txt").read_text()

    def run(args: Sequence[str]) -> str | None:
        return query if tuple(args) == QUERY_ARGS else topology

    inventory = NodeProbe(nvml=NvmlProbe(NoDriver()), smi=SmiProbe(run)).read()
    report.main(lambda: inventory)
    out = capsys.readouterr().out
    assert "reader: nvidia-smi; devices: 8" in out
    assert "  GPU7   NVL     NVL     NVL     NVL     NVL     NVL     NVL     X" in out
    assert "llama-3.1-8b: 8 x TP1: r0: 0  r1: 1  r2: 2  r3: 3  r4: 4  r5: 5  r6: 6  r7: 7" in out
    assert "llama-3.1-70b: 2 x TP4: r0: 0,1,2,3  r1: 4,5,6,7  (topology)" in out


def test_runs_with_the_standard_library_alone() -> None:
    # -S: no site-packages (no pydantic, no nvidia-ml-py), as on a bare GPU machine.
    done = subprocess.run(
        [sys.executable, "-S", "-m", "servepilot.engine.gpu.report"],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "reader: none; devices: 0" in done.stdout
    assert "llama-3.1-70b: 2 x TP4: r0: 0,1,2,3  r1: 4,5,6,7" in done.stdout
