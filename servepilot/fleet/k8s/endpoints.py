"""Endpoints of a Kubernetes Service, read from its EndpointSlices with the pod's service account
(plain HTTPS to the API server; no Kubernetes client library): what the Kubernetes backend's
watch follows (`backend`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from servepilot.core.errors import ConfigError, ServepilotError
from servepilot.fleet.k8s.api import SERVICE_ACCOUNT_DIR, KubernetesApi, KubernetesApiError

# The label the EndpointSlice controller puts on each slice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class DiscoveryError(ServepilotError):
    """The endpoints could not be listed (the source says why)."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    ip: str
    port: int
    ready: bool
    pod: str | None = field(default=None, compare=False)
    """The pod behind it, where the source knows (the EndpointSlice's targetRef)."""

    @property
    def replica_id(self) -> str:
        return f"{self.ip}:{self.port}"

    @property
    def url(self) -> str:
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


class EndpointSource(Protocol):
    async def list_endpoints(self) -> list[Endpoint]:
        """Every endpoint of the replicas now, ready or not; DiscoveryError if unknown."""
        ...


def parse_target(text: str) -> tuple[str, str | None]:
    """`k8s:SERVICE` or `k8s:SERVICE.NAMESPACE` (the --discover flag) -> (service, namespace
    or None)."""
    scheme, _, rest = text.partition(":")
    if scheme != "k8s" or not rest:
        raise ConfigError(
            f"--discover: expected k8s:SERVICE or k8s:SERVICE.NAMESPACE, got {text!r}"
        )
    service, _, namespace = rest.partition(".")
    return service, namespace or None


class KubernetesEndpoints:
    """The endpoints of `service` in `namespace` (by default the pod's own)."""

    def __init__(
        self,
        service: str,
        namespace: str | None = None,
        *,
        api_url: str | None = None,
        account_dir: Path = SERVICE_ACCOUNT_DIR,
        port_name: str = "http",
    ) -> None:
        self._service = service
        self._port_name = port_name
        try:
            self.api = KubernetesApi(namespace, api_url=api_url, account_dir=account_dir)
        except KubernetesApiError as exc:
            raise DiscoveryError(str(exc)) from None

    async def list_endpoints(self) -> list[Endpoint]:
        path = f"/apis/discovery.k8s.io/v1/namespaces/{self.api.namespace}/endpointslices"
        params = {"labelSelector": f"{SERVICE_NAME_LABEL}={self._service}"}
        try:
            body = await self.api.call("GET", path, params=params)
        except KubernetesApiError as exc:
            raise DiscoveryError(f"listing EndpointSlices: {exc}") from None
        return endpoints_from_slices(body, self._port_name)


def endpoints_from_slices(body: Mapping[str, Any], port_name: str = "http") -> list[Endpoint]:
    """Endpoints of an EndpointSliceList: the port named `port_name` (else the slice's only
    port); ready unless its conditions say not ready or terminating."""
    found: dict[tuple[str, int], Endpoint] = {}
    for item in body.get("items") or []:
        port = _port(item.get("ports") or [], port_name)
        if port is None:
            continue
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            # The API: an unset `ready` means unknown, which consumers take as ready.
            ready = conditions.get("ready") is not False and not conditions.get("terminating")
            ref = endpoint.get("targetRef") or {}
            pod = ref.get("name") if ref.get("kind") == "Pod" else None
            for ip in endpoint.get("addresses") or []:
                found[(ip, port)] = Endpoint(ip=ip, port=port, ready=ready, pod=pod)
    return [found[key] for key in sorted(found)]


def _port(ports: list[Mapping[str, Any]], name: str) -> int | None:
    named = [p for p in ports if p.get("name") == name and p.get("port")]
    chosen = named or (ports if len(ports) == 1 else [])
    port = chosen[0].get("port") if chosen else None
    return int(port) if port else None
