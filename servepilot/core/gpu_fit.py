"""Whether a fleet's replicas fit the GPUs it may use: the one check `up` and `plan` refuse
by. Plain numbers in, so it also runs where only the standard library is installed
(benchmarks/gpu_probe.py on a bare GPU machine)."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GpuDemand:
    """What a fleet asks of one node's GPUs."""

    replicas: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1

    @property
    def per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def total(self) -> int:
        return self.replicas * self.per_replica


def check_gpu_fit(demand: GpuDemand, available: int, where: str) -> None:
    """Refuse, naming the numbers, a demand over `available` GPUs (`where` says whose: "this
    node has", "hardware.gpu_ids lists", ...)."""
    if demand.total <= available:
        return
    raise ConfigError(
        f"the fleet needs {demand.total} GPUs ({demand.replicas} "
        f"replica{'s' if demand.replicas != 1 else ''} x "
        f"tensor_parallel_size {demand.tensor_parallel_size} x pipeline_parallel_size "
        f"{demand.pipeline_parallel_size}) but {where} {available}",
        hint=f"run at most {available // demand.per_replica} replicas "
        "(replicas.count, autoscale.max_replicas) or lower the parallelism",
    )
