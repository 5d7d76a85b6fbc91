"""Checking a batch's input file: JSONL of {custom_id, method, url, body}, one request a line.

As OpenAI does, a file with any bad line fails the whole batch at validation, each problem
listed with its line number in the batch's `errors`; nothing is sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_ERRORS = 100  # listed at most; the count says how many more


@dataclass(frozen=True, slots=True)
class InputLine:
    index: int
    custom_id: str
    body: str
    """The request body, as JSON text, with `stream` off (a batch line is answered whole)."""


@dataclass(frozen=True, slots=True)
class LineError:
    code: str
    message: str
    line: int | None
    param: str | None = None

    def as_openai(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "param": self.param,
                "line": self.line}  # fmt: skip


def parse_input(content: bytes, endpoint: str) -> tuple[list[InputLine], list[LineError]]:
    """The requests of a batch input file, or what is wrong with it (line numbers from 1)."""
    lines: list[InputLine] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [], [LineError("invalid_file", f"the file is not UTF-8: {exc}", None)]
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        parsed = _parse_line(raw, number, endpoint)
        if isinstance(parsed, list):
            errors.extend(parsed)
            continue
        custom_id, body = parsed
        if custom_id in seen:
            errors.append(LineError(
                "duplicate_custom_id",
                f"custom_id {custom_id!r} is also on line {seen[custom_id]}; each must be unique",
                number, "custom_id",
            ))  # fmt: skip
            continue
        seen[custom_id] = number
        lines.append(InputLine(len(lines), custom_id, body))
    if not lines and not errors:
        errors.append(LineError("empty_file", "the input file has no request lines", None))
    if len(errors) > MAX_ERRORS:
        more = len(errors) - MAX_ERRORS
        errors = errors[:MAX_ERRORS]
        errors.append(LineError("too_many_errors", f"{more} more errors not listed", None))
    return lines, errors


def _parse_line(raw: str, number: int, endpoint: str) -> tuple[str, str] | list[LineError]:
    """The line's custom_id and body, or every fault it has (fixing one at a time, a user
    would otherwise upload the file once per fault). Messages leave out the line number: it
    is the error's `line`, and `batch submit` prints it in front."""
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        # Not str(exc): its "line 1" counts within the line, beside our file's line number.
        problem = f"not valid JSON: {exc.msg} at column {exc.colno}"
        return [LineError("invalid_json_line", problem, number)]
    except (ValueError, RecursionError) as exc:
        return [LineError("invalid_json_line", f"not valid JSON: {exc}", number)]
    if not isinstance(doc, dict):
        return [LineError("invalid_json_line", "not a JSON object", number)]
    custom_id = doc.get("custom_id")
    body = doc.get("body")
    faults = [
        ("custom_id", "must be a non-empty string", isinstance(custom_id, str) and custom_id),
        ("method", "must be POST", doc.get("method") == "POST"),
        ("url", f"must be the batch's endpoint {endpoint}", doc.get("url") == endpoint),
        ("body", "must be a JSON object (the request body)", isinstance(body, dict)),
    ]
    errors = [_field(number, param, problem) for param, problem, ok in faults if not ok]
    if errors or not isinstance(custom_id, str) or not isinstance(body, dict):
        return errors
    if body.get("stream"):
        body = {**body, "stream": False}
    return custom_id, json.dumps(body)


def _field(number: int, param: str, problem: str) -> LineError:
    return LineError(f"invalid_{param}", f"{param} {problem}", number, param)
