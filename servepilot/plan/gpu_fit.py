"""Whether a fleet's replicas fit the GPUs it may use: the one check `up` and `plan` refuse
by. Plain numbers in, so it also runs where only the standard library is installed
(servepilot/engine/gpu/report.py on a bare GPU machine)."""

from __future__ import annotations

from dataclasses import dataclass

from servepilot.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GpuDemand:
    """What a fleet asks of one node's GPUs."""

    replicas: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    replicas_per_gpu: int = 1
    """Replicas sharing each group of per_replica GPUs (hardware.replicas_per_gpu)."""

    @property
    def per_replica(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def groups(self) -> int:
        """GPU groups of per_replica GPUs the replicas take: replicas_per_gpu to a group."""
        return -(-self.replicas // self.replicas_per_gpu)

    @property
    def total(self) -> int:
        return self.groups * self.per_replica

    def group_of(self, replica: int) -> int:
        """The GPU group of replica slot `replica`: consecutive slots fill a group first."""
        return replica // self.replicas_per_gpu


def check_gpu_fit(demand: GpuDemand, available: int, where: str) -> None:
    """Refuse, naming the numbers, a demand over `available` GPUs (`where` says whose: "this
    node has", "hardware.gpu_ids lists", ...)."""
    if demand.total <= available:
        return
    replicas = f"{demand.replicas} replica{'s' if demand.replicas != 1 else ''}"
    shared = demand.replicas_per_gpu
    if shared > 1:
        # Spelled out as the rounding up it is: 3 replicas at 2 per GPU still take 2 groups.
        replicas = f"{replicas} / replicas_per_gpu {shared}, rounded up, = {demand.groups}"
    most = available // demand.per_replica * shared
    raise ConfigError(
        f"the fleet needs {demand.total} GPUs ({replicas} x "
        f"tensor_parallel_size {demand.tensor_parallel_size} x pipeline_parallel_size "
        f"{demand.pipeline_parallel_size}) but {where} {available}",
        hint=f"run at most {most} replicas (replicas.count, autoscale.max_replicas), "
        "lower the parallelism or raise hardware.replicas_per_gpu",
    )
