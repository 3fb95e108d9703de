"""An input file's lines, checked as OpenAI checks them before a batch starts: each a
JSON object with a unique ``custom_id``, ``method: POST``, the batch's ``url`` and an
object ``body``. Any failure fails the whole batch, with every reason (up to
``MAX_ERRORS``) in its ``errors``; a body's own content is checked when its line runs,
by the endpoint, as an online request's would be.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.batch.objects import LineError

MAX_ERRORS = 100


@dataclass(frozen=True, slots=True)
class Line:
    """One request of a batch. ``index``: its 0-based position among the input's lines
    (blank lines skipped), the key its result is stored under."""

    index: int
    custom_id: str
    body: dict[str, Any]


def parse_lines(data: bytes, endpoint: str, max_lines: int) -> tuple[list[Line], list[LineError]]:
    """The input's lines, or the reasons it is refused."""
    lines: list[Line] = []
    errors: list[LineError] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.splitlines(), start=1):
        if len(errors) >= MAX_ERRORS:
            break
        if not raw.strip():
            continue
        parsed = _line(raw, number, endpoint, seen)
        if isinstance(parsed, LineError):
            errors.append(parsed)
        else:
            lines.append(Line(len(lines), *parsed))
    if not lines and not errors:
        errors.append(LineError("empty_file", "The input file has no requests."))
    if len(lines) > max_lines:
        errors.append(
            LineError(
                "too_many_requests",
                f"The input file has {len(lines)} requests; at most {max_lines} are allowed "
                "(batch.max_lines).",
            )
        )
    return lines, errors


def _line(
    raw: bytes, number: int, endpoint: str, seen: set[str]
) -> tuple[str, dict[str, Any]] | LineError:
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return LineError("invalid_json_line", "This line is not parseable as valid JSON.", number)
    if not isinstance(item, dict):
        return LineError("invalid_json_line", "This line is not a JSON object.", number)
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        message = "custom_id must be a non-empty string."
        return LineError("missing_required_parameter", message, number, "custom_id")
    if custom_id in seen:
        return LineError(
            "duplicate_custom_id",
            "The custom_id for this request is a duplicate of another request. The "
            "custom_id parameter must be unique for each request in a batch.",
            number,
            "custom_id",
        )
    seen.add(custom_id)
    if item.get("method") != "POST":
        return LineError("invalid_method", "method must be 'POST'.", number, "method")
    if item.get("url") != endpoint:
        return LineError(
            "invalid_url",
            f"The URL provided for this request does not match the batch endpoint {endpoint}.",
            number,
            "url",
        )
    body = item.get("body")
    if not isinstance(body, dict):
        return LineError("invalid_request", "body must be a JSON object.", number, "body")
    return custom_id, body
