"""Pydantic wire types of ``POST /v1/responses`` (the OpenAI Responses API).

The top level is parsed here; ``input`` items, ``tools`` and ``text.format`` are kept as
plain objects and validated one by one in ``translate`` so every 400 names the exact
``param`` (``input[2].content[0]``, ``tools[1].type``) in OpenAI's notation.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from backends.base import ReasoningEffort

MAX_METADATA_KEYS = 16
MetadataKey = Annotated[str, StringConstraints(max_length=64)]
MetadataValue = Annotated[str, StringConstraints(max_length=512)]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class TextParam(_Wire):
    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


Summary = Literal["auto", "concise", "detailed"]


class ReasoningParam(_Wire):
    """``reasoning``: the effort asked (``none``: no thought); a summary is accepted but
    none is made (the item carries the raw thought in ``content``, as vLLM does)."""

    effort: ReasoningEffort | None = None
    summary: Summary | None = None
    generate_summary: Summary | None = None


class ResponsesRequest(_Wire):
    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    metadata: dict[MetadataKey, MetadataValue] | None = Field(None, max_length=MAX_METADATA_KEYS)
    user: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    previous_response_id: str | None = None
    max_tool_calls: int | None = Field(None, ge=1)
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    reasoning: ReasoningParam | None = None
    # Known fields we cannot honour: set to anything but their default → 400 naming them.
    background: bool | None = None
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    context_management: list[Any] | None = None

    @property
    def stores(self) -> bool:
        """OpenAI stores every response unless ``store`` is false."""
        return self.store is not False

    def unknown_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class InputTextPart(_Wire):
    type: Literal["input_text", "output_text"]
    text: str


class MessageItem(_Wire):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]


class ReasoningTextPart(_Wire):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(_Wire):
    """A thought handed back: its text in ``content`` (or, summaries being the thought
    elsewhere, ``summary``), or sealed in ``encrypted_content`` (``thought_seal``)."""

    type: Literal["reasoning"]
    content: list[ReasoningTextPart] | None = None
    summary: list[ReasoningTextPart] = Field(default_factory=list)
    encrypted_content: str | None = None


class FunctionCallItem(_Wire):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class FunctionCallOutputItem(_Wire):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[dict[str, Any]]


class FunctionToolParam(_Wire):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class JsonSchemaFormat(_Wire):
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None
