"""OpenAI wire types for requests, mirroring the official names.

Only requests are pydantic models: they are parsed once here and turned into backend
types by ``gateway.api.translate``. Responses are plain dicts built in
``gateway.service.chat_bodies`` (cheaper to serialise with orjson on the streaming
path, and validated against the official schemas in the tests). Unknown fields are
allowed and reported, so clients that send newer fields keep working; known fields we
cannot honour are rejected by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backends.base import ReasoningEffort

MAX_STOP_SEQUENCES = 4


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def unknown_fields(self) -> list[str]:
        return sorted(self.model_extra or {})


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    type: Literal["text"]
    text: str


class ContentPart(BaseModel):
    """Any non-text part (image_url, input_audio, file): accepted by the schema, then
    refused by the service with the part's path as ``param``."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: str


class WireMessage(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    role: Literal["system", "user", "assistant", "developer", "tool", "function"]
    content: str | list[TextPart | ContentPart] | None = None
    name: str | None = None
    # Checked field by field in gateway.api.tool_wire, so each error names its exact param.
    tool_calls: list[Any] | None = None
    tool_call_id: str | None = None
    function_call: Any = None
    # An assistant turn's thought, handed back (DeepSeek's name, and vLLM's).
    reasoning_content: str | None = None
    reasoning: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    include_usage: bool = False


Stop = str | Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None


class SamplingFields(_Wire):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    n: int = Field(1, ge=1, le=128)
    stop: Stop = None
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    user: str | None = None
    # vLLM's: lower runs first; the front door checks it against the client key's range.
    priority: int | None = None
    ignore_eos: bool = False
    # Honoured only by backends that declare Feature.LOGIT_BIAS (gateway.service.capabilities).
    logit_bias: dict[str, float] | None = None

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: Stop) -> Stop:
        if isinstance(value, list) and any(item == "" for item in value):
            raise ValueError("stop sequences must be non-empty strings")
        return value


class ChatCompletionRequest(SamplingFields):
    messages: list[WireMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    functions: list[dict[str, Any]] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    audio: Any = None
    modalities: list[str] | None = None
    reasoning_effort: ReasoningEffort | None = None
    # vLLM's extensions: variables for the chat template (Qwen3's enable_thinking), and
    # the most tokens the thought may take.
    chat_template_kwargs: dict[str, Any] | None = None
    thinking_token_budget: int | None = Field(None, ge=0)


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    # 0 only with echo or prompt_logprobs: the prompt scored, nothing generated.
    max_tokens: int | None = Field(None, ge=0)
    logprobs: int | None = Field(None, ge=0, le=5)
    # vLLM's extension: each prompt token's log-probability and this many alternatives.
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = Field(None, ge=1)
