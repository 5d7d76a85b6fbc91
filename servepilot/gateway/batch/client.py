"""A small blocking client of the gateway's batch API (stdlib only), for the CLI: upload a
JSONL file, create its batch, poll it, fetch its result files."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servepilot.gateway.batch.lines import ENDPOINTS

DONE = ("completed", "failed", "expired", "cancelled")


class BatchClientError(RuntimeError):
    """The gateway refused a call or could not be reached; the message says which and why."""


class BatchClient:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 60.0) -> None:
        self._url = url.rstrip("/")
        self._key = api_key
        self._timeout_s = timeout_s

    def upload(self, path: Path) -> dict[str, Any]:
        boundary = uuid.uuid4().hex
        body = b"".join([
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
            "batch\r\n".encode(),
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{path.name}\"\r\nContent-Type: application/jsonl\r\n\r\n".encode(),
            path.read_bytes(), f"\r\n--{boundary}--\r\n".encode(),
        ])  # fmt: skip
        return self._json("POST", "/v1/files", body, f"multipart/form-data; boundary={boundary}")

    def create(self, file_id: str, endpoint: str, window: str) -> dict[str, Any]:
        doc = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window}
        return self._json("POST", "/v1/batches", json.dumps(doc).encode(), "application/json")

    def retrieve(self, batch_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/batches/{batch_id}")

    def content(self, file_id: str) -> bytes:
        return self._call("GET", f"/v1/files/{file_id}/content")

    def follow(
        self,
        batch: dict[str, Any],
        on_update: Callable[[dict[str, Any]], None],
        poll_s: float = 1.0,
    ) -> dict[str, Any]:
        """`batch` polled every `poll_s` until it ends (`on_update` gets each answer)."""
        while batch["status"] not in DONE:
            time.sleep(poll_s)
            batch = self.retrieve(batch["id"])
            on_update(batch)
        return batch

    def save_files(self, batch: dict[str, Any], path: Path) -> list[tuple[str, Path]]:
        """An ended batch's output and error files, beside its input `path` (NAME.output.jsonl,
        NAME.errors.jsonl): which were written, where."""
        written = []
        for key, suffix in (("output_file_id", "output"), ("error_file_id", "errors")):
            if batch.get(key):
                target = path.with_name(f"{path.stem}.{suffix}.jsonl")
                target.write_bytes(self.content(batch[key]))
                written.append((suffix, target))
        return written

    def _json(
        self, method: str, path: str, body: bytes | None = None, ctype: str | None = None
    ) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self._call(method, path, body, ctype))
        return doc

    def _call(
        self, method: str, path: str, body: bytes | None = None, ctype: str | None = None
    ) -> bytes:
        request = urllib.request.Request(self._url + path, data=body, method=method)
        if ctype is not None:
            request.add_header("Content-Type", ctype)
        if self._key:
            request.add_header("Authorization", f"Bearer {self._key}")
        try:
            with urllib.request.urlopen(request, timeout=self._timeout_s) as response:
                data: bytes = response.read()
                return data
        except urllib.error.HTTPError as exc:
            raise BatchClientError(f"{method} {path}: HTTP {exc.code}: {_message(exc)}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise BatchClientError(f"cannot reach the gateway at {self._url}: {exc}") from None


def endpoint_of(path: Path) -> str:
    """The endpoint of a batch input file: its first line's url (the gateway checks the rest)."""
    with path.open("rb") as lines:
        for raw in lines:
            if raw.strip():
                try:
                    url = json.loads(raw).get("url")
                except (ValueError, AttributeError):
                    break
                if url in ENDPOINTS:
                    return str(url)
                break
    return ENDPOINTS[0]


def _message(exc: urllib.error.HTTPError) -> str:
    text = exc.read().decode("utf-8", "replace")
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text[:300] or str(exc.reason)
