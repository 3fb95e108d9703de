"""Response objects, output items and stream events in OpenAI's Responses shapes.

Validated against the official ``Response`` and ``ResponseStreamEvent`` schemas in
tests/service/test_responses_api.py. Everything is a plain dict encoded with orjson.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any, Literal

import orjson

from backends.base import ApiError, TokenLogprob, Usage
from gateway.api.responses.wire import ResponsesRequest
from gateway.service.chat_bodies import chat_logprobs

Status = Literal["in_progress", "completed", "incomplete", "failed"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def text_part(text: str, logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
    # An output_text part's logprobs have the chat message's per-token shape.
    rendered = chat_logprobs(logprobs)["content"] if logprobs else []
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": rendered}


def event_logprobs(logprobs: Sequence[TokenLogprob]) -> list[dict[str, Any]]:
    """The lighter shape stream events carry (no bytes)."""
    return [
        {
            "token": entry.token,
            "logprob": entry.logprob,
            "top_logprobs": [{"token": top.token, "logprob": top.logprob} for top in entry.top],
        }
        for entry in logprobs
    ]


def message_item(
    item_id: str, text: str | None, status: ItemStatus, logprobs: Sequence[TokenLogprob] = ()
) -> dict[str, Any]:
    """``text=None``: the item as first announced, before any content part."""
    content = [] if text is None else [text_part(text, logprobs)]
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def reasoning_text(text: str) -> dict[str, str]:
    return {"type": "reasoning_text", "text": text}


def reasoning_item(
    item_id: str, text: str | None, status: ItemStatus, sealed: str | None = None
) -> dict[str, Any]:
    """A thought as vLLM renders it: the raw text in ``content``, an empty ``summary``;
    ``sealed`` (the ``encrypted_content``) only when the request included it.
    ``text=None``: the item as first announced."""
    return {
        "id": item_id,
        "type": "reasoning",
        "status": status,
        "summary": [],
        "content": [] if text is None else [reasoning_text(text)],
        "encrypted_content": sealed,
    }


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: ItemStatus
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


_ITEM_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "reasoning": "rs",
}


def with_id(item: dict[str, Any]) -> dict[str, Any]:
    """The input item with an ``id`` (a new one if the client sent none), so a stored
    conversation lists with stable ids."""
    if isinstance(item.get("id"), str):
        return item
    return {**item, "id": new_id(_ITEM_PREFIX.get(item.get("type", "message"), "item"))}


def item_resource(item: dict[str, Any]) -> dict[str, Any]:
    """A stored item as ``GET /v1/responses/{id}/input_items`` lists it."""
    kind = item.get("type", "message")
    resource: dict[str, Any] = {"id": item["id"], "type": kind, "status": "completed"}
    if kind == "message":
        content = item["content"]
        if isinstance(content, str) and item["role"] == "assistant":
            content = [text_part(content)]
        elif isinstance(content, str):
            content = [{"type": "input_text", "text": content}]
        return {**resource, "role": item["role"], "content": content}
    if kind == "reasoning":
        return {
            **resource,
            "summary": item.get("summary") or [],
            "content": item.get("content") or [],
            "encrypted_content": item.get("encrypted_content"),
        }
    fields = ("call_id", "name", "arguments") if kind == "function_call" else ("call_id", "output")
    return {**resource, **{name: item[name] for name in fields}}


def usage_object(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }


def error_object(exc: ApiError) -> dict[str, str]:
    """The Responses ``error`` field: its ``code`` comes from a closed list."""
    if exc.status == 429:
        code = "rate_limit_exceeded"
    elif exc.status < 500:
        code = "invalid_prompt"
    else:
        code = "server_error"
    return {"code": code, "message": exc.message}


class ResponseShape:
    """The fields every rendering of one response shares (id, model, request echo)."""

    __slots__ = ("created_at", "echo", "id", "model")

    def __init__(
        self, response_id: str, created_at: int, model: str, wire: ResponsesRequest
    ) -> None:
        self.id = response_id
        self.created_at = created_at
        self.model = model
        self.echo = _request_echo(wire)

    def render(
        self,
        status: Status,
        output: Sequence[dict[str, Any]],
        usage: Usage | None = None,
        error: ApiError | None = None,
    ) -> dict[str, Any]:
        done = status in ("completed", "incomplete", "failed")
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        rendered = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": int(time.time()) if done else None,
            "error": error_object(error) if error is not None else None,
            "incomplete_details": incomplete,
            "model": self.model,
            "output": list(output),
            **self.echo,
        }
        if usage is not None:  # the schema has no null usage
            rendered["usage"] = usage_object(usage)
        return rendered


def _request_echo(wire: ResponsesRequest) -> dict[str, Any]:
    text = wire.text
    text_format = (text.format if text is not None else None) or {"type": "text"}
    verbosity = (text.verbosity if text is not None else None) or "medium"
    echo: dict[str, Any] = {
        "background": False,
        "instructions": wire.instructions,
        "max_output_tokens": wire.max_output_tokens,
        "max_tool_calls": wire.max_tool_calls,
        "metadata": dict(wire.metadata or {}),
        "parallel_tool_calls": wire.parallel_tool_calls is not False,
        "previous_response_id": wire.previous_response_id,
        "reasoning": {
            "effort": wire.reasoning.effort if wire.reasoning is not None else None,
            "summary": wire.reasoning.summary if wire.reasoning is not None else None,
        },
        "service_tier": "default",
        "store": wire.stores,
        "temperature": 1.0 if wire.temperature is None else wire.temperature,
        "text": {
            "format": text_format,
            "verbosity": verbosity,
        },
        "tool_choice": wire.tool_choice if wire.tool_choice is not None else "auto",
        "tools": [_tool_echo(tool) for tool in wire.tools or []],
        "top_logprobs": wire.top_logprobs or 0,
        "top_p": 1.0 if wire.top_p is None else wire.top_p,
        "truncation": "disabled",
    }
    if wire.user is not None:
        echo["user"] = wire.user
    return echo


def _tool_echo(tool: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": tool.get("parameters"),
        "strict": tool.get("strict", True),
    }


class EventWriter:
    """Frames one response's stream events, numbering them in order."""

    __slots__ = ("_sequence",)

    def __init__(self) -> None:
        self._sequence = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"
