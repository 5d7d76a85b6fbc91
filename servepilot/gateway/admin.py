"""`/admin/replicas`: list, add, and drain-then-remove upstream replicas at run time."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from aiohttp import web

from servepilot.gateway.errors import INVALID_REQUEST, GatewayError, bad_request
from servepilot.gateway.pool import DuplicateReplica, ReplicaNotFound, ReplicaPool, normalize_url

DEFAULT_DRAIN_TIMEOUT_S = 30.0
# Ids appear in URLs (DELETE /admin/replicas/{id}) and as Prometheus label values.
_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_MAX_ADMIN_BODY_BYTES = 64 * 1024


class AdminHandlers:
    def __init__(self, pool: ReplicaPool) -> None:
        self._pool = pool

    async def list_replicas(self, request: web.Request) -> web.Response:
        return web.json_response([info.to_json() for info in self._pool.replicas()])

    async def add_replica(self, request: web.Request) -> web.Response:
        replica_id, url = _parse_add(await _read_small_body(request))
        try:
            info = await self._pool.add(replica_id or self._pool.new_id(), url)
        except DuplicateReplica as exc:
            raise GatewayError(409, str(exc), error_type=INVALID_REQUEST, code="conflict") from None
        return web.json_response(info.to_json(), status=201)

    async def remove_replica(self, request: web.Request) -> web.Response:
        replica_id = request.match_info["replica_id"]
        timeout_s = _parse_timeout(request.query.get("timeout_s"))
        try:
            drained = await self._pool.remove(replica_id, timeout_s)
        except ReplicaNotFound:
            raise GatewayError(
                404,
                f"no replica with id {replica_id!r}",
                error_type=INVALID_REQUEST,
                code="replica_not_found",
            ) from None
        return web.json_response({"id": replica_id, "removed": True, "drained": drained})


async def _read_small_body(request: web.Request) -> bytes:
    declared = request.content_length
    if declared is not None and declared > _MAX_ADMIN_BODY_BYTES:
        raise bad_request("the request body is too large for an admin request")
    return await request.read()


def _parse_add(body: bytes) -> tuple[str | None, str]:
    try:
        doc: Any = json.loads(body)
    except ValueError:
        raise bad_request("the request body is not valid JSON", "invalid_json") from None
    if not isinstance(doc, dict):
        raise bad_request('expected a JSON object like {"id": "r3", "url": "http://host:port"}')
    url = doc.get("url")
    if not isinstance(url, str):
        raise bad_request("`url` (a string like http://host:port) is required", "missing_field")
    replica_id = doc.get("id")
    if replica_id is not None and (
        not isinstance(replica_id, str) or not _ID_PATTERN.fullmatch(replica_id)
    ):
        raise bad_request("`id` must be 1-64 letters, digits, '_', '.', ':' or '-'")
    return replica_id, _normalized(url)


def _normalized(url: str) -> str:
    try:
        return normalize_url(url)
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def _parse_timeout(raw: str | None) -> float:
    if raw is None:
        return DEFAULT_DRAIN_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise bad_request("`timeout_s` must be a number of seconds >= 0")
    return value
