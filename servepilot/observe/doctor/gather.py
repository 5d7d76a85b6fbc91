"""Collect doctor's evidence from a live fleet and this machine: the gateway's and replicas'
/metrics over HTTP, the replica logs the caller found, /dev/shm, the CPU's flags and
`nvidia-smi topo -m` where there are GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

from servepilot.core.config import FleetConfig
from servepilot.engine.cpu import cpu_flags
from servepilot.observe.doctor.evidence import EnvFacts, Evidence, ReplicaEvidence
from servepilot.observe.top.poll import get_json, get_text, replica_pages
from servepilot.observe.top.sample import replica_states

SHM_PATH = "/dev/shm"
_NVIDIA_SMI_TIMEOUT_S = 15.0


@dataclass(frozen=True, slots=True)
class Gathered:
    evidence: Evidence
    notes: tuple[str, ...]
    """What could not be looked at (a gateway that did not answer, ...)."""


def gather(
    config: FleetConfig,
    gateway_url: str | None,
    logs: Mapping[str, str],
    placement_groups: tuple[tuple[str, str], ...] = (),
) -> Gathered:
    """`logs`: each replica's log text by replica id (the run folder's, when `up` runs the
    fleet here)."""
    notes: list[str] = []
    gateway_text: str | None = None
    metrics: dict[str, str] = {}
    ids: list[str] = []
    if gateway_url is not None:
        try:
            gateway_text = get_text(f"{gateway_url}/metrics")
            replicas = replica_states(get_json(f"{gateway_url}/admin/replicas"))
        except (OSError, ValueError) as exc:
            notes.append(
                f"live metrics not read: the gateway at {gateway_url} did not answer ({exc})"
            )
        else:
            _, metrics, problems = replica_pages(replicas)
            notes += problems
            ids = [r.replica_id for r in replicas]
    ids += [i for i in logs if i not in ids]
    replicas_evidence = tuple(ReplicaEvidence(i, metrics.get(i), logs.get(i, "")) for i in ids)
    evidence = Evidence(config, gateway_text, replicas_evidence, environment(placement_groups))
    return Gathered(evidence, tuple(notes))


def environment(placement_groups: tuple[tuple[str, str], ...] = ()) -> EnvFacts:
    return EnvFacts(
        shm_bytes=shm_bytes(),
        cpu_flags=cpu_flags(),
        gpu_topology=gpu_topology(),
        placement_groups=placement_groups,
    )


def shm_bytes() -> int | None:
    try:
        stat = os.statvfs(SHM_PATH)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def gpu_topology() -> str | None:
    """`nvidia-smi topo -m`, or None on a machine without NVIDIA GPUs (or a driver)."""
    binary = shutil.which("nvidia-smi")
    if binary is None:
        return None
    try:
        done = subprocess.run(
            [binary, "topo", "-m"],
            capture_output=True,
            text=True,
            timeout=_NVIDIA_SMI_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 and "GPU0" in done.stdout else None
