"""Endpoints of a Kubernetes Service, read from its EndpointSlices with the pod's service account
(plain HTTPS to the API server; no Kubernetes client library)."""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from servepilot.gateway.discovery import DiscoveryError, Endpoint

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# The label the EndpointSlice controller puts on each slice of a Service.
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
_TIMEOUT = aiohttp.ClientTimeout(total=10.0)


def parse_target(text: str) -> tuple[str, str | None]:
    """`k8s:SERVICE` or `k8s:SERVICE.NAMESPACE` -> (service, namespace or None)."""
    scheme, _, rest = text.partition(":")
    if scheme != "k8s" or not rest:
        raise ValueError(f"expected k8s:SERVICE or k8s:SERVICE.NAMESPACE, got {text!r}")
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
        self._account_dir = account_dir
        self._namespace = namespace or _read(account_dir / "namespace")
        self._api_url = api_url or _in_cluster_url(os.environ)
        self._port_name = port_name

    async def list_endpoints(self) -> list[Endpoint]:
        url = (
            f"{self._api_url}/apis/discovery.k8s.io/v1/namespaces/{self._namespace}/endpointslices"
        )
        # The token is read each time: a projected service account token is rotated on disk.
        headers = {"Authorization": f"Bearer {_read(self._account_dir / 'token')}"}
        params = {"labelSelector": f"{SERVICE_NAME_LABEL}={self._service}"}
        # A session per listing: one request every few seconds, and nothing to close later.
        connector = aiohttp.TCPConnector(ssl=self._ssl_context())
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=_TIMEOUT) as session,
                session.get(url, headers=headers, params=params) as response,
            ):
                if response.status != 200:
                    text = (await response.text())[:200]
                    raise DiscoveryError(f"listing EndpointSlices: HTTP {response.status} {text}")
                body = await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise DiscoveryError(f"listing EndpointSlices at {self._api_url}: {exc}") from None
        return endpoints_from_slices(body, self._port_name)

    def _ssl_context(self) -> ssl.SSLContext | bool:
        ca = self._account_dir / "ca.crt"
        if not self._api_url.startswith("https://"):
            return False
        return ssl.create_default_context(cafile=str(ca)) if ca.is_file() else True


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
            for ip in endpoint.get("addresses") or []:
                found[(ip, port)] = Endpoint(ip=ip, port=port, ready=ready)
    return [found[key] for key in sorted(found)]


def _port(ports: list[Mapping[str, Any]], name: str) -> int | None:
    named = [p for p in ports if p.get("name") == name and p.get("port")]
    chosen = named or (ports if len(ports) == 1 else [])
    port = chosen[0].get("port") if chosen else None
    return int(port) if port else None


def _in_cluster_url(env: Mapping[str, str]) -> str:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise DiscoveryError(
            "KUBERNETES_SERVICE_HOST is unset: --discover k8s:... runs inside a pod "
            "(or give the API server's URL)"
        )
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}"


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise DiscoveryError(
            f"cannot read {path} ({exc.strerror}): the pod needs its service account token "
            "(automountServiceAccountToken) to read EndpointSlices"
        ) from None
