"""``POST /tokenize`` and ``POST /detokenize``: vLLM's shapes (at the server root, as vLLM
serves them), turned into ``backends.tokenizing`` requests for the tokenizer service.

Tokenize takes a ``prompt``, or chat ``messages`` (with ``tools``) that the model's chat
template renders first, parsed exactly as a chat completion's messages are; it answers
``{count, max_model_len, tokens, token_strs}``. ``add_special_tokens`` defaults as
vLLM's: on for a prompt, off for messages (the template writes them);
``add_generation_prompt`` defaults to on unless ``continue_final_message`` is set, and
asking for both is a 400. Detokenize takes ``tokens`` and answers ``{prompt}``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from backends.base import InvalidRequest
from backends.tokenizing import DetokenizeRequest, TokenizeRequest
from gateway.api.base import Endpoint, Prepared, parse_wire
from gateway.api.translate import chat_request
from gateway.api.whole import WholePresenter, metered
from gateway.api.wire import ChatCompletionRequest, WireMessage, _Wire
from gateway.observe.record import RequestRecord
from gateway.service.tokenizing import TokenizeService


class TokenizeWire(_Wire):
    """vLLM's tokenize request, either form; unknown fields are reported."""

    model: str = Field(min_length=1)
    prompt: str | None = None
    messages: list[WireMessage] | None = Field(None, min_length=1)
    tools: list[dict[str, Any]] | None = None
    add_special_tokens: bool | None = Field(
        None, description="Add the tokenizer's special tokens; default: on for a prompt only."
    )
    add_generation_prompt: bool | None = Field(
        None, description="End a chat with the assistant's turn opened; default: on."
    )
    continue_final_message: bool = Field(False, description="Leave the last message open.")
    return_token_strs: bool = Field(False, description="Also answer each token's string.")


# Any vocabulary fits below 2**31; the bound also keeps ids JSON-safe for a relay.
TokenId = Annotated[int, Field(ge=0, lt=2**31)]


class DetokenizeWire(_Wire):
    model: str = Field(min_length=1)
    tokens: list[TokenId] = Field(description="Token ids, each in 0 .. 2**31 - 1.")


def tokenize_request(wire: TokenizeWire, request_id: str, arrival: float) -> TokenizeRequest:
    if (wire.prompt is None) == (wire.messages is None):
        raise InvalidRequest("set exactly one of prompt and messages", param="prompt")
    if wire.continue_final_message and wire.add_generation_prompt:
        raise InvalidRequest(
            "continue_final_message and add_generation_prompt cannot both be true",
            param="continue_final_message",
        )
    if wire.prompt is not None:
        return TokenizeRequest(
            request_id=request_id,
            model=wire.model,
            prompt=wire.prompt,
            add_special_tokens=True if wire.add_special_tokens is None else wire.add_special_tokens,
            return_token_strs=wire.return_token_strs,
        )
    # The messages (and tools) parse and fail exactly as a chat completion's do.
    chat = ChatCompletionRequest(model=wire.model, messages=wire.messages or [], tools=wire.tools)
    parsed = chat_request(chat, request_id, arrival)
    opened = wire.add_generation_prompt
    return TokenizeRequest(
        request_id=request_id,
        model=wire.model,
        messages=parsed.messages,
        tools=parsed.tools,
        add_special_tokens=bool(wire.add_special_tokens),
        add_generation_prompt=not wire.continue_final_message if opened is None else opened,
        continue_final_message=wire.continue_final_message,
        return_token_strs=wire.return_token_strs,
    )


def detokenize_request(wire: DetokenizeWire, request_id: str) -> DetokenizeRequest:
    return DetokenizeRequest(request_id=request_id, model=wire.model, tokens=tuple(wire.tokens))


class TokenizeEndpoint(Endpoint):
    path = "/tokenize"
    wire = TokenizeWire
    summary = "Tokenize a prompt or chat messages with the model's tokenizer (vLLM shape)"

    def __init__(self, service: TokenizeService) -> None:
        self._service = service

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[dict[str, Any]]:
        wire = parse_wire(TokenizeWire, body)
        record.requested_model = wire.model
        request = tokenize_request(wire, record.request_id, record.arrival_time)

        async def answer(record: RequestRecord) -> dict[str, Any]:
            result, _ = await self._service.tokenize(request, record)
            return {
                "count": len(result.tokens),
                "max_model_len": result.max_model_len,
                "tokens": list(result.tokens),
                "token_strs": None if result.token_strs is None else list(result.token_strs),
            }

        # No model runs: metered as a request of no prompt tokens.
        stand_in = metered(record.request_id, wire.model, record.arrival_time)
        return Prepared(stand_in, False, WholePresenter(answer), generates=False)


class DetokenizeEndpoint(Endpoint):
    path = "/detokenize"
    wire = DetokenizeWire
    summary = "Turn token ids back into text with the model's tokenizer (vLLM shape)"

    def __init__(self, service: TokenizeService) -> None:
        self._service = service

    async def prepare(self, body: Any, record: RequestRecord) -> Prepared[dict[str, Any]]:
        wire = parse_wire(DetokenizeWire, body)
        record.requested_model = wire.model
        request = detokenize_request(wire, record.request_id)

        async def answer(record: RequestRecord) -> dict[str, Any]:
            text, _ = await self._service.detokenize(request, record)
            return {"prompt": text}

        stand_in = metered(record.request_id, wire.model, record.arrival_time)
        return Prepared(stand_in, False, WholePresenter(answer), generates=False)


def tokenize_endpoints(service: TokenizeService) -> tuple[Endpoint, ...]:
    return (TokenizeEndpoint(service), DetokenizeEndpoint(service))
