"""The seam between the controller and whatever runs replicas: local processes
(`local.LocalScaling`), Ray actors (`fleet.ray.scaling.RayScaling`), a Deployment's scale
subresource (`fleet.k8s.scaling.KubernetesScaling`, run by the gateway in a cluster)."""

from __future__ import annotations

from typing import Protocol


class ScalingBackend(Protocol):
    """Starts and stops replicas for the controller. A replica it starts joins the gateway by
    itself once ready; until then it is `starting`. Draining a replica at the gateway is the
    controller's, before it calls `remove`."""

    def starting(self) -> tuple[str, ...]:
        """Ids of the replicas launched and not yet in the gateway, oldest first."""
        ...

    def remove_first(self) -> frozenset[str]:
        """Ready replicas to give back before the others when the fleet shrinks (the Ray
        backend's: added ones that had to share a node with another under `spread`)."""
        ...

    async def add(self) -> str:
        """Launch one replica without waiting for it to load; its id."""
        ...

    async def remove(self, replica_id: str) -> None:
        """Stop a replica: one the gateway has drained, or one still starting."""
        ...

    async def close(self) -> None:
        """Stop waiting for the replicas still starting (`up` stops their processes)."""
        ...
