"""A small API server on 127.0.0.1 that answers, for one namespace, as Kubernetes does: a
Deployment's scale subresource (GET; merge PATCH of an autoscaling/v1 Scale, checked against
the Scale schema of kubernetes-validate and its resourceVersion) and PATCH of a pod's metadata.
Unknown objects are 404 and refused calls 403, each with a Status body. `gateway_scaling`
serves the gateway on it as `gateway --discover k8s:SVC --scale-deployment NAME` runs."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
from aiohttp import web

from servepilot.core.config import GatewayConfig, parse_config
from servepilot.fleet.autoscale.start import in_cluster
from servepilot.fleet.k8s.backend import DISCOVERY_INTERVAL_S, KubernetesBackend
from servepilot.fleet.k8s.endpoints import KubernetesEndpoints
from servepilot.fleet.k8s.scaling import KubernetesScaling
from servepilot.fleet.membership import following
from servepilot.gateway import serve
from tests.unit.fake_upstream import free_port
from tests.unit.k8s_support import KUBERNETES_VERSION

DEPLOYMENT = "servepilot-vllm"
SCALE = f"/apis/apps/v1/namespaces/llm/deployments/{DEPLOYMENT}/scale"
MERGE_PATCH = "application/merge-patch+json"
SA = "system:serviceaccount:llm:servepilot-gateway"


@dataclass
class FakeCluster:
    namespace: str = "llm"
    replicas: dict[str, int] = field(default_factory=dict)
    """Deployments and their spec.replicas."""
    pods: dict[str, dict[str, str]] = field(default_factory=dict)
    """Pods and their annotations."""
    endpoints: dict[str, tuple[str, int, bool]] = field(default_factory=dict)
    """Pods serving the Service, and their (ip, port, ready): one EndpointSlice each."""
    forbidden: set[str] = field(default_factory=set)
    """Resources the service account may not touch ("deployments/scale", "pods")."""
    version: int = 1
    races: int = 0
    """GETs of a Scale after which another writer changes the Deployment (a 409 for us)."""
    calls: list[tuple[str, str]] = field(default_factory=list)
    """(method, path) of each call, in order."""
    tokens: list[str | None] = field(default_factory=list)

    def scale(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": name, "namespace": self.namespace,
                         "resourceVersion": str(self.version)},
            "spec": {"replicas": self.replicas[name]},
            "status": {"replicas": self.replicas[name], "selector": "app=vllm"},
        }  # fmt: skip


def status(code: int, reason: str, message: str) -> web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}  # fmt: skip
    return web.json_response(body, status=code)


def _refused(cluster: FakeCluster, request: web.Request, resource: str) -> web.Response | None:
    cluster.calls.append((request.method, request.path))
    cluster.tokens.append(request.headers.get("Authorization"))
    if request.match_info["ns"] != cluster.namespace:
        return status(404, "NotFound", f'namespaces "{request.match_info["ns"]}" not found')
    if resource in cluster.forbidden:
        verb = request.method.lower()
        group = ' in API group "apps"' if resource.startswith("deployments") else ""
        where = f'{group} in the namespace "{cluster.namespace}"'
        message = f'{resource} is forbidden: User "{SA}" cannot {verb} resource "{resource}"'
        return status(403, "Forbidden", message + where)
    return None


def _app(cluster: FakeCluster) -> web.Application:
    async def get_scale(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if (refused := _refused(cluster, request, "deployments/scale")) is not None:
            return refused
        if name not in cluster.replicas:
            return status(404, "NotFound", f'deployments.apps "{name}" not found')
        answer = web.json_response(cluster.scale(name))
        if cluster.races > 0:
            cluster.races -= 1
            cluster.version += 1
        return answer

    async def patch_scale(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if (refused := _refused(cluster, request, "deployments/scale")) is not None:
            return refused
        if name not in cluster.replicas:
            return status(404, "NotFound", f'deployments.apps "{name}" not found')
        if request.content_type != MERGE_PATCH:
            return status(415, "UnsupportedMediaType", f"{request.content_type} not supported")
        body = json.loads(await request.text())
        try:
            kubernetes_validate.validate(body, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            return status(422, "Invalid", f"Scale.autoscaling is invalid: {exc}")
        version = body.get("metadata", {}).get("resourceVersion")
        if version is not None and version != str(cluster.version):
            return status(409, "Conflict", "the object has been modified; please apply your "
                          "changes to the latest version and try again")  # fmt: skip
        cluster.replicas[name] = body["spec"]["replicas"]
        cluster.version += 1
        return web.json_response(cluster.scale(name))

    async def patch_pod(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if (refused := _refused(cluster, request, "pods")) is not None:
            return refused
        if name not in cluster.pods:
            return status(404, "NotFound", f'pods "{name}" not found')
        patch = json.loads(await request.text())
        cluster.pods[name].update(patch["metadata"]["annotations"])
        return web.json_response({"kind": "Pod", "metadata": {"name": name}})

    async def slices(request: web.Request) -> web.Response:
        if (refused := _refused(cluster, request, "endpointslices")) is not None:
            return refused
        items = [
            {"ports": [{"name": "http", "port": port}],
             "endpoints": [{"addresses": [ip], "conditions": {"ready": ready},
                            "targetRef": {"kind": "Pod", "name": pod}}]}
            for pod, (ip, port, ready) in cluster.endpoints.items()
        ]  # fmt: skip
        return web.json_response({"kind": "EndpointSliceList", "items": items})

    app = web.Application()
    app.router.add_get("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices", slices)
    scale = "/apis/apps/v1/namespaces/{ns}/deployments/{name}/scale"
    app.router.add_get(scale, get_scale)
    app.router.add_patch(scale, patch_scale)
    app.router.add_patch("/api/v1/namespaces/{ns}/pods/{name}", patch_pod)
    return app


@contextlib.asynccontextmanager
async def api_server(cluster: FakeCluster) -> AsyncIterator[str]:
    """The API server's URL while it runs."""
    runner = web.AppRunner(_app(cluster), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def service_account(folder: Path, namespace: str = "llm") -> Path:
    (folder / "token").write_text("tok-1\n")
    (folder / "namespace").write_text(f"{namespace}\n")
    return folder


async def gateway_scaling(
    cluster: FakeCluster,
    tmp_path: Path,
    section: dict[str, object],
    until: Callable[[], bool],
    fleet: dict[str, object] | None = None,
    interval_s: float = DISCOVERY_INTERVAL_S,
) -> None:
    """Serve a gateway on `cluster` with the section's autoscaler (`fleet`: the rest of its
    fleet.yaml, as `k8s render` writes its ConfigMap) until `until()` holds."""
    section = {"enabled": True, "interval_s": 0.2, "window_s": 0, "drain_timeout_s": 1} | section
    config = parse_config({"autoscale": section, **(fleet or {})}, origin="test")
    async with api_server(cluster) as url:
        source = KubernetesEndpoints(DEPLOYMENT, api_url=url,
                                     account_dir=service_account(tmp_path))  # fmt: skip

        def scaling(backend: KubernetesBackend) -> KubernetesScaling:
            return KubernetesScaling(source.api, DEPLOYMENT, source, backend.ready_ids)

        backend = KubernetesBackend(source, scaling, interval_s=interval_s, drain_timeout_s=1.0,
                                    sleep_mode=config.engine.sleep_mode)  # fmt: skip
        stop = asyncio.Event()
        task = asyncio.ensure_future(
            serve(GatewayConfig(port=0), [], stop=stop, drain_timeout_s=1.0,
                  members=lambda g: following(backend, g.membership),
                  alongside=lambda g: in_cluster(config, g, backend))
        )  # fmt: skip
        try:
            while not until():
                assert not task.done(), task.exception()
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await task
