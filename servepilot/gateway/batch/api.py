"""The OpenAI Files and Batch routes of the gateway, and the batch service they drive.

    POST /v1/files                 multipart upload, purpose "batch" (JSONL of requests)
    GET  /v1/files/{id}            the file object
    GET  /v1/files/{id}/content    the file's bytes (inputs, outputs, errors)
    POST /v1/batches               {input_file_id, endpoint, completion_window, metadata}
    GET  /v1/batches               newest first, ?after=<id>&limit=<1..100>
    GET  /v1/batches/{id}
    POST /v1/batches/{id}/cancel

Bad requests get a 400 naming the problem (404 for an unknown id), never a 500.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

from servepilot.core.config import BatchConfig
from servepilot.gateway.batch.db import Database
from servepilot.gateway.batch.exchange import Answer
from servepilot.gateway.batch.files import INPUT_PURPOSE, FileStore
from servepilot.gateway.batch.jobs import JobStore
from servepilot.gateway.batch.lines import ENDPOINTS, parse_input
from servepilot.gateway.batch.multipart import MultipartError, parse_form
from servepilot.gateway.batch.scheduler import BatchScheduler, FleetRoom
from servepilot.gateway.errors import INVALID_REQUEST, NOT_FOUND, GatewayError, bad_request
from servepilot.http1 import HttpRequest, UploadLimit

FILES = "/v1/files"
BATCHES = "/v1/batches"
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smh])$")
_WINDOW_UNIT_S = {"s": 1, "m": 60, "h": 3600}
_MAX_PAGE = 100

Send = Callable[[str, bytes], Awaitable[Answer]]
Handler = Callable[[HttpRequest, str], Awaitable[None]]


class BatchApi:
    """The batch service: its store, its scheduler and its routes."""

    def __init__(self, config: BatchConfig, send: Send, room: Callable[[], FleetRoom]) -> None:
        self.config = config
        self._db = Database(config.store_path())
        self.files = FileStore(self._db, config.files_path())
        self.jobs = JobStore(self._db, self.files)
        self.scheduler = BatchScheduler(self.jobs, send, config, room)
        # (collection, path segments, action, method) -> handler
        self._routes: dict[tuple[str, int, str, str], Handler] = {
            ("files", 1, "", "POST"): self._upload,
            ("files", 2, "", "GET"): self._file,
            ("files", 3, "content", "GET"): self._file_content,
            ("batches", 1, "", "POST"): self._create,
            ("batches", 1, "", "GET"): self._list,
            ("batches", 2, "", "GET"): self._batch,
            ("batches", 3, "cancel", "POST"): self._cancel,
        }

    @property
    def upload_limit(self) -> UploadLimit:
        return UploadLimit(FILES, self.config.max_file_bytes, "gateway.batch.max_file_bytes")

    async def start(self) -> None:
        """Run the jobs of the store (a restart picks up the batches in progress there)."""
        self.scheduler.start()

    async def stop_jobs(self, drain_timeout_s: float) -> None:
        """Start no more lines; let those in flight finish (up to the timeout)."""
        await self.scheduler.stop(drain_timeout_s)

    async def close(self) -> None:
        """Close the store, once no request of the API can come any more."""
        await self.scheduler.stop()
        await self._db.close()

    @staticmethod
    def owns(path: str) -> bool:
        return path in (FILES, BATCHES) or path.startswith((FILES + "/", BATCHES + "/"))

    @staticmethod
    def route_label(path: str) -> str:
        """One metrics label per route, whatever the ids."""
        parts = path.split("/")
        if len(parts) == 3:
            return path
        tail = "/" + parts[4] if len(parts) > 4 else ""
        return f"/{parts[1]}/{parts[2]}/{{id}}{tail}"

    async def handle(self, request: HttpRequest) -> None:
        parts = request.path.split("/")[2:]  # ["files"], ["batches", id, "cancel"], ...
        route = (parts[0], len(parts), parts[2] if len(parts) > 2 else "", request.method)
        handler = self._routes.get(route)
        allowed = [key[3] for key in self._routes if key[:3] == route[:3]]
        if handler is None and allowed:
            raise GatewayError(405, f"{request.method} is not allowed on {request.path}",
                               error_type=INVALID_REQUEST, code="method_not_allowed",
                               headers={"Allow": ", ".join(allowed)})  # fmt: skip
        if handler is None:
            raise GatewayError(404, f"no route {request.method} {request.path}",
                               error_type=INVALID_REQUEST, code="not_found")  # fmt: skip
        await handler(request, parts[1] if len(parts) > 1 else "")

    # --- files --------------------------------------------------------------------------

    async def _upload(self, request: HttpRequest, _: str) -> None:
        try:
            form = parse_form(request.headers.get("content-type", ""), request.body)
        except MultipartError as exc:
            raise bad_request(f"POST /v1/files: {exc}", "invalid_multipart") from None
        purpose = form.get("purpose")
        if purpose is None or purpose.content.decode("utf-8", "replace") != INPUT_PURPOSE:
            raise bad_request("purpose must be 'batch' (the only files this gateway keeps)")
        upload = form.get("file")
        if upload is None or upload.filename is None:
            raise bad_request("the form has no 'file' part with a filename", "missing_file")
        stored = await self.files.save(upload.filename, INPUT_PURPOSE, upload.content)
        _json(request, stored.as_openai())

    async def _file(self, request: HttpRequest, file_id: str) -> None:
        stored = await self.files.get(file_id)
        if stored is None:
            raise _not_found("file", file_id)
        _json(request, stored.as_openai())

    async def _file_content(self, request: HttpRequest, file_id: str) -> None:
        stored = await self.files.get(file_id)
        if stored is None:
            raise _not_found("file", file_id)
        try:
            content = await self.files.content(stored)
        except OSError as exc:  # removed from disk behind the store's back
            message = f"the content of file {file_id!r} is gone: {exc}"
            raise GatewayError(
                404, message, error_type=NOT_FOUND, code="file_content_missing"
            ) from None
        request.respond(200, content, b"application/jsonl")

    # --- batches ------------------------------------------------------------------------

    async def _create(self, request: HttpRequest, _: str) -> None:
        doc = _body(request)
        endpoint = doc.get("endpoint")
        if endpoint not in ENDPOINTS:
            raise bad_request(f"endpoint must be one of {', '.join(ENDPOINTS)}, got {endpoint!r}")
        window = doc.get("completion_window")
        window_s = _window_s(window)
        metadata = doc.get("metadata")
        if metadata is not None and not _string_map(metadata):
            raise bad_request("metadata must be an object of string values")
        file_id = doc.get("input_file_id")
        stored = await self.files.get(file_id) if isinstance(file_id, str) else None
        if stored is None or stored.purpose != INPUT_PURPOSE:
            raise bad_request(f"input_file_id {file_id!r} is not an uploaded batch file",
                              "invalid_input_file")  # fmt: skip
        content = await self.files.content(stored)
        # Parsing a large file takes a while: off the event loop, like every store call.
        lines, errors = await asyncio.to_thread(parse_input, content, endpoint)
        batch = await self.jobs.create(endpoint, stored.file_id, window_s, str(window), metadata,
                                       lines, errors)  # fmt: skip
        self.scheduler.wake()
        _json(request, batch)

    async def _list(self, request: HttpRequest, _: str) -> None:
        query = urllib.parse.parse_qs(request.query)
        after = query.get("after", [None])[-1]
        raw_limit = query.get("limit", ["20"])[-1]
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= _MAX_PAGE:
            raise bad_request(f"limit must be an integer from 1 to {_MAX_PAGE}")
        batches, more = await self.jobs.page(after, int(raw_limit))
        _json(request, {
            "object": "list", "data": batches, "has_more": more,
            "first_id": batches[0]["id"] if batches else None,
            "last_id": batches[-1]["id"] if batches else None,
        })  # fmt: skip

    async def _batch(self, request: HttpRequest, batch_id: str) -> None:
        batch = await self.jobs.get(batch_id)
        if batch is None:
            raise _not_found("batch", batch_id)
        _json(request, batch)

    async def _cancel(self, request: HttpRequest, batch_id: str) -> None:
        batch = await self.jobs.cancel(batch_id)
        if batch is None:
            raise _not_found("batch", batch_id)
        self.scheduler.wake()
        _json(request, batch)


def _window_s(window: object) -> int:
    """completion_window in seconds: OpenAI's "24h", or any <n>s, <n>m or <n>h."""
    match = _WINDOW.match(window) if isinstance(window, str) else None
    if match is None:
        raise bad_request(f"completion_window must be like '24h' (<n>h, <n>m or <n>s), "
                          f"got {window!r}")  # fmt: skip
    return int(match.group(1)) * _WINDOW_UNIT_S[match.group(2)]


def _string_map(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _body(request: HttpRequest) -> dict[str, Any]:
    try:
        doc = json.loads(request.body)
    except (ValueError, RecursionError):
        raise bad_request("the request body is not valid JSON", "invalid_json") from None
    if not isinstance(doc, dict):
        raise bad_request("the request body must be a JSON object", "invalid_json")
    return doc


def _json(request: HttpRequest, doc: dict[str, Any]) -> None:
    request.respond(200, json.dumps(doc).encode())


def _not_found(kind: str, object_id: str) -> GatewayError:
    return GatewayError(404, f"no {kind} with id {object_id!r}", error_type=NOT_FOUND,
                        code=f"{kind}_not_found")  # fmt: skip
