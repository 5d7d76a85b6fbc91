"""A multipart/form-data body (RFC 7578), as the openai client uploads files.

Small on purpose: the parts are found by their boundary in the bytes, and only their
Content-Disposition (name, filename) is read, with the stdlib's header parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message


class MultipartError(ValueError):
    """The body is not the multipart/form-data its Content-Type says."""


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    content: bytes


def boundary_of(content_type: str) -> str:
    message = Message()
    message["content-type"] = content_type
    if message.get_content_type() != "multipart/form-data":
        raise MultipartError(f"expected multipart/form-data, got {content_type or 'nothing'}")
    boundary = message.get_param("boundary")
    if not isinstance(boundary, str) or not boundary:
        raise MultipartError("the multipart/form-data Content-Type has no boundary")
    return boundary


def parse_form(content_type: str, body: bytes) -> dict[str, Part]:
    """The form's parts by name (a repeated name keeps its last part)."""
    delimiter = b"--" + boundary_of(content_type).encode("latin-1")
    chunks = body.split(delimiter)
    if len(chunks) < 3 or not chunks[-1].startswith(b"--"):
        raise MultipartError("the multipart body is cut short (no closing boundary)")
    parts: dict[str, Part] = {}
    for chunk in chunks[1:-1]:
        part = _part(chunk)
        parts[part.name] = part
    return parts


def _part(chunk: bytes) -> Part:
    if not chunk.startswith(b"\r\n") or not chunk.endswith(b"\r\n"):
        raise MultipartError("a multipart part is not framed by CRLF")
    head, sep, content = chunk[2:-2].partition(b"\r\n\r\n")
    if not sep:
        raise MultipartError("a multipart part has no blank line after its headers")
    message = Message()
    for line in head.decode("utf-8", "replace").split("\r\n"):
        header, colon, value = line.partition(":")
        if colon:
            message[header.strip()] = value.strip()
    field = message.get_param("name", header="content-disposition")
    if not isinstance(field, str):
        raise MultipartError("a multipart part has no Content-Disposition name")
    return Part(field, message.get_filename(), content)
