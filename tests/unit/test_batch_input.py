"""Batch input files (JSONL lines) and the multipart uploads that carry them."""

from __future__ import annotations

import json

import httpx
import pytest

from servepilot.core.config import FleetConfig, GatewayConfig
from servepilot.gateway.batch.lines import parse_input
from servepilot.gateway.batch.multipart import MultipartError, parse_form
from servepilot.http1 import Limits, UploadLimit

CHAT = "/v1/chat/completions"


def line(custom_id: str, url: str = CHAT, **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                       "body": {"model": "m", **body}})  # fmt: skip


def test_good_lines_are_numbered_and_lose_stream() -> None:
    content = f"{line('a')}\n\n{line('b', stream=True)}\n".encode()
    lines, errors = parse_input(content, CHAT)
    assert errors == []
    assert [(ln.index, ln.custom_id) for ln in lines] == [(0, "a"), (1, "b")]
    assert json.loads(lines[1].body) == {"model": "m", "stream": False}


def test_each_bad_line_is_named_with_its_number() -> None:
    content = "\n".join([
        line("a"), "[1, 2", line("a"), line("c", url="/v1/completions"),
        json.dumps({"custom_id": "d", "method": "GET", "url": CHAT, "body": {}}),
        json.dumps({"method": "POST", "url": CHAT, "body": {}}),
        json.dumps({"custom_id": "e", "method": "POST", "url": CHAT, "body": "text"}),
    ]).encode()  # fmt: skip
    lines, errors = parse_input(content, CHAT)
    assert [ln.custom_id for ln in lines] == ["a"]
    assert [(e.code, e.line) for e in errors] == [
        ("invalid_json_line", 2), ("duplicate_custom_id", 3), ("invalid_url", 4),
        ("invalid_method", 5), ("invalid_custom_id", 6), ("invalid_body", 7),
    ]  # fmt: skip
    assert "also on line 1" in errors[1].message


def test_empty_and_non_utf8_files() -> None:
    assert [e.code for e in parse_input(b"\n\n", CHAT)[1]] == ["empty_file"]
    assert [e.code for e in parse_input(b"\xff\xfe", CHAT)[1]] == ["invalid_file"]


def test_the_error_list_is_bounded() -> None:
    _, errors = parse_input(b"x\n" * 150, CHAT)
    assert len(errors) == 101 and errors[-1].message == "50 more errors not listed"


def test_multipart_as_httpx_sends_it() -> None:
    request = httpx.Request("POST", "http://x/v1/files", data={"purpose": "batch"},
                            files={"file": ("in.jsonl", b"a\r\n--b\r\n")})  # fmt: skip
    form = parse_form(request.headers["content-type"], request.read())
    assert form["purpose"].content == b"batch" and form["purpose"].filename is None
    assert (form["file"].filename, form["file"].content) == ("in.jsonl", b"a\r\n--b\r\n")


@pytest.mark.parametrize(
    ("content_type", "body", "problem"),
    [
        ("application/json", b"{}", "expected multipart/form-data"),
        ("multipart/form-data", b"", "no boundary"),
        ("multipart/form-data; boundary=B", b"--B\r\nx: y\r\n\r\nz\r\n", "cut short"),
        ("multipart/form-data; boundary=B", b"--B\r\nno blank line\r\n--B--", "no blank"),
        ("multipart/form-data; boundary=B", b"--B\r\nx: y\r\n\r\nz\r\n--B--", "no Content"),
    ],
)
def test_malformed_multipart(content_type: str, body: bytes, problem: str) -> None:
    with pytest.raises(MultipartError, match=problem):
        parse_form(content_type, body)


def test_upload_paths_get_their_own_body_limit() -> None:
    limits = Limits(1024, uploads=(UploadLimit("/v1/files", 4096, "gateway.batch.max_file_bytes"),))
    assert limits.body_limit(b"/v1/files") == (4096, " (gateway.batch.max_file_bytes)")
    assert limits.body_limit(b"/v1/chat/completions") == (1024, "")


def test_batch_section_defaults_and_errors(tmp_path: object) -> None:
    batch = GatewayConfig().batch
    assert batch.enabled and batch.max_concurrency == 64 and batch.max_file_bytes == 100 << 20
    assert batch.store_path().name == "batch.sqlite3"
    absolute = GatewayConfig.model_validate({"batch": {"store": "sqlite:////var/b.db"}})
    assert str(absolute.batch.store_path()) == "/var/b.db"
    with pytest.raises(ValueError, match=r"batch\.store[\s\S]*must be sqlite:///"):
        FleetConfig.model_validate({"gateway": {"batch": {"store": "postgres://db"}}})
    with pytest.raises(ValueError, match=r"batch\.max_concurrency"):
        FleetConfig.model_validate({"gateway": {"batch": {"max_concurrency": 0}}})


def test_every_fault_of_a_line_is_listed_and_no_message_repeats_its_line() -> None:
    # The line number travels in `line`; `batch submit` prints "line N: <message>".
    several = {"custom_id": "", "method": "GET", "url": "/v1/embeddings", "body": "text"}
    content = "\n".join([line("a"), "{not json", json.dumps(several)]).encode()
    _, errors = parse_input(content, CHAT)
    assert [(e.code, e.line, e.param) for e in errors] == [
        ("invalid_json_line", 2, None), ("invalid_custom_id", 3, "custom_id"),
        ("invalid_method", 3, "method"), ("invalid_url", 3, "url"), ("invalid_body", 3, "body"),
    ]  # fmt: skip
    assert errors[0].message.startswith("not valid JSON: ")
    assert errors[1].message == "custom_id must be a non-empty string"
    assert not any("line" in e.message for e in errors)
