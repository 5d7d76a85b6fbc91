"""The compiled builds answer what pure Python does on the benchmarks' own workloads, each run
in a fresh process both ways: bench_sim_speed's fleet run (`make sim-fast`) and
gateway_instructions' everyday point through a real Gateway on fake sockets (`make
gateway-fast`). Skipped where no build matches the sources. Moved from tests/unit/
test_sim_speedups.py and test_accel.py: they run benchmark code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _fresh_process(code: str, env: dict[str, str], *argv: str) -> str:
    inherited = {k: v for k, v in os.environ.items() if not k.endswith("_PURE")}
    done = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=ROOT, env=inherited | env, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()


_FLEET_RUN = """
import json, sys
sys.path.insert(0, "benchmarks")
import argparse, bench_sim_speed
from servepilot.core import accel
args = argparse.Namespace(duration=3.0, rate=800.0, replicas=12, policy=sys.argv[1], seed=1,
                          kv_events=sys.argv[2] == "on")
out = bench_sim_speed.run(args)
s = out.stats
stats = [s.sim_s, s.steps, s.preemptions, s.prefix_hit_rate, s.shed, s.queued, s.events]
print(json.dumps([accel.compiled(accel.SIM), out.run.model_dump(mode="json"), stats]))
"""


@pytest.mark.parametrize(
    ("policy", "kv_events"),
    [("least_load", "off"), ("prefix_affinity", "off"), ("prefix_affinity", "on")],
)
def test_a_compiled_fleet_run_equals_the_pure_python_one(policy: str, kv_events: str) -> None:
    compiled = json.loads(_fresh_process(_FLEET_RUN, {}, policy, kv_events))
    if not compiled[0]:
        pytest.skip("no compiled build for these sources (`make sim-fast`)")
    pure = json.loads(_fresh_process(_FLEET_RUN, {"SERVEPILOT_SIM_PURE": "1"}, policy, kv_events))
    assert pure[0] is False
    assert compiled[1:] == pure[1:]


_GATEWAY_RUN = """
import json, sys
sys.path.insert(0, "benchmarks")
import uvloop, gateway_instructions
from servepilot.core import accel
import servepilot.gateway.relay as relay
uvloop.run(gateway_instructions._requests(40))  # exits non-zero unless every event arrived
print(json.dumps([accel.compiled(accel.GATEWAY), relay.__file__.endswith(".so")]))
"""


def test_a_compiled_gateway_relays_what_the_pure_python_one_does() -> None:
    """The everyday point's streamed answers through a real Gateway on fake sockets
    (benchmarks/gateway_instructions.py checks every event of the last 20, in valid chunked
    framing): compiled, when a build matches, and in Python."""
    compiled = json.loads(_fresh_process(_GATEWAY_RUN, {}))
    pure = json.loads(_fresh_process(_GATEWAY_RUN, {"SERVEPILOT_GATEWAY_PURE": "1"}))
    assert pure == [False, False]
    if not compiled[0]:
        pytest.skip("no compiled gateway build for these sources (`make gateway-fast`)")
    assert compiled == [True, True]
