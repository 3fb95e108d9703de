"""The Hermes tool-call markup: its markers, call ids, and one call written out."""

from __future__ import annotations

import json
import secrets

from backends.base import GenerationRequest, ToolCall

OPEN = "<tool_call>"

CLOSE = "</tool_call>"


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def tools_active(request: GenerationRequest) -> bool:
    return bool(request.tools) and request.effective_tool_choice.mode != "none"


def render_call(call: ToolCall) -> str:
    return f'{OPEN}\n{{"name": {json.dumps(call.name)}, "arguments": {call.arguments}}}\n{CLOSE}'
