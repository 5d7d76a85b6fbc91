"""The Kubernetes API server, as a pod reaches it with its service account: plain HTTPS with the
account's token and CA (no Kubernetes client library). The Kubernetes backend (`backend`) lists
the replicas' EndpointSlices through it (`endpoints`), and reads and patches the Deployment's
scale subresource and its pods (`scaling`)."""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from servepilot.core.errors import ServepilotError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MERGE_PATCH = "application/merge-patch+json"
_TIMEOUT = aiohttp.ClientTimeout(total=10.0)


class KubernetesApiError(ServepilotError):
    """A call the API server refused (`status`: its HTTP status, 0 when it was unreachable);
    the message carries the Status object's own message."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class KubernetesApi:
    """Calls to the API server at `api_url` (by default the pod's in-cluster address), as the
    service account whose token, CA and namespace are in `account_dir`."""

    def __init__(
        self,
        namespace: str | None = None,
        *,
        api_url: str | None = None,
        account_dir: Path = SERVICE_ACCOUNT_DIR,
    ) -> None:
        self._account_dir = account_dir
        self.namespace = namespace or read_account_file(account_dir / "namespace")
        self.url = api_url or in_cluster_url(os.environ)

    async def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        patch: Mapping[str, Any] | None = None,
    ) -> Any:
        """The JSON body of a 200 answer to `method path` (`patch`: a JSON merge patch);
        KubernetesApiError for any other answer, naming the call and the API's message."""
        # The token is read each time: a projected service account token is rotated on disk.
        headers = {"Authorization": f"Bearer {read_account_file(self._account_dir / 'token')}"}
        data = None
        if patch is not None:
            headers["Content-Type"] = MERGE_PATCH
            data = json.dumps(patch).encode()
        # A session per call: a few calls a minute at most, and nothing to close later.
        connector = aiohttp.TCPConnector(ssl=self._ssl_context())
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=_TIMEOUT) as session,
                session.request(
                    method, f"{self.url}{path}", headers=headers, params=params, data=data
                ) as response,
            ):
                if response.status != 200:
                    text = await response.text()
                    raise KubernetesApiError(
                        f"{method} {path}: HTTP {response.status} {status_message(text)}",
                        response.status,
                    )
                return await response.json()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise KubernetesApiError(f"{method} {path} at {self.url}: {exc}", 0) from None

    def _ssl_context(self) -> ssl.SSLContext | bool:
        ca = self._account_dir / "ca.crt"
        if not self.url.startswith("https://"):
            return False
        return ssl.create_default_context(cafile=str(ca)) if ca.is_file() else True


def status_message(text: str) -> str:
    """The message of a Status body (how the API explains a refusal), else the text's start."""
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200]
    message = body.get("message") if isinstance(body, dict) else None
    return str(message) if message else text[:200]


def in_cluster_url(env: Mapping[str, str]) -> str:
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubernetesApiError(
            "KUBERNETES_SERVICE_HOST is unset: --discover k8s:... runs inside a pod "
            "(or give the API server's URL)",
            0,
        )
    host = f"[{host}]" if ":" in host else host
    return f"https://{host}:{port}"


def read_account_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise KubernetesApiError(
            f"cannot read {path} ({exc.strerror}): the pod needs its service account token "
            "(automountServiceAccountToken) to call the API server",
            0,
        ) from None
