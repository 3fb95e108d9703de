"""Pydantic wire types of ``POST /v1/messages`` and ``/v1/messages/count_tokens`` (the
Anthropic Messages API).

The top level is parsed here; ``system`` blocks, ``messages`` content blocks, ``tools``
and ``tool_choice`` are kept as plain objects and checked one by one in ``translate`` so
every 400 names the exact field (``messages[1].content[0].source``). Unknown fields are
allowed (newer clients keep working); known ones we cannot honour are refused by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def unknown_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class WireMessage(_Wire):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class Metadata(_Wire):
    user_id: str | None = Field(None, max_length=256)


class CountTokensRequest(_Wire):
    """What ``count_tokens`` takes: the prompt side of a messages request."""

    model: str = Field(min_length=1)
    messages: list[WireMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    # Checked in translate (thinking_controls), so each error names its exact field.
    thinking: dict[str, Any] | None = None
    # Known fields we cannot honour: set to anything but "off" → 400 naming them.
    mcp_servers: list[Any] | None = None
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None
    context_management: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    stream: bool = False
    # A scheduling hint of Anthropic's own capacity tiers: nothing to choose between here.
    service_tier: Literal["auto", "standard_only"] | None = None
    container: str | dict[str, Any] | None = None
