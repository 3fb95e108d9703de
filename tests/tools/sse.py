"""Reading named server-sent events (``event: <type>`` + ``data: {...}``), as the
Responses and Messages streams send them."""

from __future__ import annotations

from typing import Any

import orjson


def named_events(text: str) -> list[dict[str, Any]]:
    """Each event's JSON, in order; every ``event:`` line names its data's ``type``."""
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        head, data = block.split("\n")
        event: dict[str, Any] = orjson.loads(data.removeprefix("data: "))
        assert head == f"event: {event['type']}"
        events.append(event)
    return events
