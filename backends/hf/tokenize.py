"""``ModelTokenizer``: ``/tokenize`` and ``/detokenize`` for an in-process hf model, with
its own tokenizer and chat template and without its engine.

Ownership: the engine thread owns the tokenizer it loaded; this object holds a private
copy, made once at load, that nothing reconfigures afterwards. Fast tokenizers encode
and decode concurrently from several threads as long as nobody changes their truncation
or padding, which no call here does, so each call runs on a worker thread
(``asyncio.to_thread``) and the event loop never waits on a long text. No request
reaches the scheduler.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from backends.base import GenerationRequest, InvalidRequest, RequestKind, SamplingParams
from backends.tokenizing import DetokenizeRequest, TokenizeRequest, TokenizeResult
from backends.tool_markup.markup import tools_active
from backends.tool_markup.prompt import chat_messages, template_takes_tools, tools_json


class ModelTokenizer:
    """See the module docstring. ``max_model_len`` is the model's context in tokens."""

    def __init__(self, tokenizer: Any, max_model_len: int) -> None:
        self._tokenizer = copy.deepcopy(tokenizer)
        # The first call drops any truncation the tokenizer file set (a write); made
        # here, once, so concurrent calls later only read.
        self._tokenizer("", add_special_tokens=False)
        self._vocab = len(self._tokenizer)
        self.max_model_len = max_model_len

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        return await asyncio.to_thread(self._tokenize, request)

    async def detokenize(self, request: DetokenizeRequest) -> str:
        for index, token in enumerate(request.tokens):
            if not 0 <= token < self._vocab:
                raise InvalidRequest(
                    f"tokens[{index}] is {token}, outside this model's vocabulary "
                    f"0..{self._vocab - 1}",
                    param="tokens",
                )
        text = await asyncio.to_thread(self._tokenizer.decode, list(request.tokens))
        return str(text)

    def _tokenize(self, request: TokenizeRequest) -> TokenizeResult:
        tokenizer = self._tokenizer
        text = render(tokenizer, request) if request.messages else request.prompt
        ids = [
            int(i)
            for i in tokenizer(text, add_special_tokens=request.add_special_tokens)["input_ids"]
        ]
        strs = None
        if request.return_token_strs:
            strs = tuple(str(s) for s in tokenizer.convert_ids_to_tokens(ids))
        return TokenizeResult(tuple(ids), self.max_model_len, strs)


def render(tokenizer: Any, request: TokenizeRequest) -> str:
    """A tokenize request's messages through the chat template, tools and past calls
    rendered as a chat request's are (``backends.tool_markup.prompt``), with the
    request's own generation-prompt switches. A template that refuses the messages, or
    none at all, is the client's 400 naming ``messages``."""
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest(
            "this model has no chat template (a base model?): tokenize a `prompt` instead",
            param="messages",
        )
    chat = GenerationRequest(
        request_id=request.request_id,
        model=request.model,
        kind=RequestKind.CHAT,
        sampling=SamplingParams(),
        messages=request.messages,
        tools=request.tools,
    )
    takes_tools = template_takes_tools(tokenizer)
    extra: dict[str, Any] = {}
    if takes_tools and tools_active(chat):
        extra["tools"] = tools_json(chat)
    try:
        text = tokenizer.apply_chat_template(
            chat_messages(chat, takes_tools),
            tokenize=False,
            add_generation_prompt=request.add_generation_prompt,
            continue_final_message=request.continue_final_message,
            **extra,
        )
    except Exception as exc:  # jinja's TemplateError, transformers' ValueError
        raise InvalidRequest(
            f"the chat template refused these messages: {exc}", param="messages"
        ) from None
    return str(text)
