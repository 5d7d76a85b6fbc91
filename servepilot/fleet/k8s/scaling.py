"""The Kubernetes backend's start and stop (`backend.KubernetesBackend`), run by the autoscaler
in the gateway in the cluster (`servepilot gateway --discover k8s:SVC --scale-deployment NAME`):
it changes the replicas' Deployment through its scale subresource (GET, then a merge PATCH of an
`autoscaling/v1` Scale carrying the resourceVersion read, so a concurrent change is refused,
not overwritten) with the pod's service account, which the Role `scaler_role(NAME)` allows.

add: replicas + 1. The new pod joins the gateway through the backend's EndpointSlice watch once
ready; until then it counts as starting, under a placeholder id (`pending-N`), matched to
the first replica that joins after it (`launched_as` tells which: the autoscaler follows a pod
it launched to refill its warm pool).

remove: the controller has drained the replica at the gateway. Kubernetes, not we, picks the
pod a scale-down deletes, so the backend first annotates the drained pod with the lowest
`controller.kubernetes.io/pod-deletion-cost` (PATCH of the pod), then scales down by one: the
ReplicaSet deletes that pod. Kubernetes ranks pods not yet scheduled, pending or not ready
before the deletion cost, so a pod still starting goes instead of the drained one; the
controller removes starting replicas first for this reason too (removing a placeholder is a
plain scale-down). A StatefulSet or LeaderWorkerSet removes its highest ordinal whatever the
annotation, so only a Deployment is scaled here.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable, Collection
from typing import Any

from servepilot.core.errors import ServepilotError
from servepilot.fleet.k8s.api import KubernetesApi, KubernetesApiError
from servepilot.fleet.k8s.endpoints import EndpointSource

log = logging.getLogger(__name__)

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
DRAINED_DELETION_COST = -(2**31)
"""The lowest int32: the drained pod goes before any other ready pod, whatever their costs."""
PENDING_PREFIX = "pending-"
_CONFLICT_TRIES = 3


def scaler_role(deployment: str) -> str:
    """The Role that lets the gateway scale `deployment` (rendered by `k8s render`)."""
    return f"{deployment}-scaler"


class ScalingForbidden(ServepilotError):
    """The API server refused a call for want of RBAC (HTTP 403)."""


class KubernetesScaling:
    """Scales the Deployment `deployment` in `api`'s namespace; `pods` lists the replicas'
    endpoints with their pods (the backend's source); `joined` gives the replica ids serving
    now (those the backend's watch has seen ready)."""

    def __init__(
        self,
        api: KubernetesApi,
        deployment: str,
        pods: EndpointSource,
        joined: Callable[[], Collection[str]],
    ) -> None:
        self._api = api
        self._deployment = deployment
        self._pods = pods
        self._joined = joined
        self._known: set[str] = set(joined())
        self._pending: collections.deque[str] = collections.deque()
        self._launched_as: dict[str, str] = {}
        """Replica ids serving, by the placeholder each was matched to."""
        self._ids = itertools.count(1)

    @property
    def scale_path(self) -> str:
        namespace = self._api.namespace
        return f"/apis/apps/v1/namespaces/{namespace}/deployments/{self._deployment}/scale"

    async def prime(self) -> None:
        """Count as starting the pods the Deployment asks for beyond those in the gateway (at
        `kubectl apply` the gateway is up minutes before the vLLM pods)."""
        scale = await self._get_scale()
        self._follow()
        for _ in range(_replicas(scale) - len(self._known)):
            self._pending.append(self._new_id())

    def starting(self) -> tuple[str, ...]:
        self._follow()
        return tuple(self._pending)

    def launched_as(self, replica_id: str) -> str:
        """The placeholder `add` returned for the pod that joined as `replica_id`, if any."""
        return self._launched_as.get(replica_id, "")

    def remove_first(self) -> frozenset[str]:
        return frozenset()  # every pod is alike: newest first

    async def add(self) -> str:
        self._follow()
        replicas = await self._scale_by(1)
        rid = self._new_id()
        self._pending.append(rid)
        log.info("autoscale: deployment %s scaled to %d", self._deployment, replicas)
        return rid

    async def remove(self, replica_id: str) -> None:
        if replica_id in self._pending:
            # Nothing drained: Kubernetes deletes a pod not yet ready first.
            self._pending.remove(replica_id)
        else:
            await self._mark_for_deletion(await self._pod_of(replica_id))
        replicas = await self._scale_by(-1)
        log.info("autoscale: deployment %s scaled to %d", self._deployment, replicas)

    async def close(self) -> None:
        self._pending.clear()  # the pods start anyway; a new gateway counts them (prime)

    def _follow(self) -> None:
        """Each replica that joined the gateway since the last look was the oldest pending."""
        now = set(self._joined())
        for rid in sorted(now - self._known):
            if self._pending:
                self._launched_as[rid] = self._pending.popleft()
        self._known |= now
        for gone in self._launched_as.keys() - now:
            del self._launched_as[gone]

    def _new_id(self) -> str:
        return f"{PENDING_PREFIX}{next(self._ids)}"

    async def _pod_of(self, replica_id: str) -> str:
        for endpoint in await self._pods.list_endpoints():
            if endpoint.replica_id == replica_id and endpoint.pod is not None:
                return endpoint.pod
        # Scaling down without the annotation would delete some other pod.
        raise ServepilotError(f"no pod found for replica {replica_id} in the EndpointSlices")

    async def _mark_for_deletion(self, pod: str) -> None:
        path = f"/api/v1/namespaces/{self._api.namespace}/pods/{pod}"
        patch = {"metadata": {"annotations": {DELETION_COST: str(DRAINED_DELETION_COST)}}}
        await self._call("PATCH", path, patch, what=f"patch pods ({pod})")

    async def _get_scale(self) -> dict[str, Any]:
        return dict(await self._call("GET", self.scale_path, None, what="get deployments/scale"))

    async def _scale_by(self, delta: int) -> int:
        """The Deployment's replicas moved by `delta`, read and written anew if it changed in
        between (HTTP 409: another writer, or the controller's own status update)."""
        for _ in range(_CONFLICT_TRIES - 1):
            try:
                return await self._scale_once(delta)
            except KubernetesApiError as exc:
                if exc.status != 409:
                    raise
        return await self._scale_once(delta)

    async def _scale_once(self, delta: int) -> int:
        scale = await self._get_scale()
        replicas = max(0, _replicas(scale) + delta)
        meta = {"name": self._deployment, "namespace": self._api.namespace}
        version = (scale.get("metadata") or {}).get("resourceVersion")
        if version is not None:
            meta["resourceVersion"] = version
        body = {"apiVersion": "autoscaling/v1", "kind": "Scale", "metadata": meta,
                "spec": {"replicas": replicas}}  # fmt: skip
        await self._call("PATCH", self.scale_path, body, what="patch deployments/scale")
        return replicas

    async def _call(self, method: str, path: str, patch: dict[str, Any] | None, what: str) -> Any:
        try:
            return await self._api.call(method, path, patch=patch)
        except KubernetesApiError as exc:
            if exc.status == 403:
                raise ScalingForbidden(
                    f"the gateway's service account may not {what}: the Role "
                    f"{scaler_role(self._deployment)} (from `servepilot k8s render`) grants "
                    f"it; apply it and its RoleBinding ({exc})"
                ) from None
            raise


def _replicas(scale: dict[str, Any]) -> int:
    return int((scale.get("spec") or {}).get("replicas") or 0)
