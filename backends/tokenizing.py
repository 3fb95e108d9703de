"""The tokenizer half of the backend contract: what ``/tokenize`` and ``/detokenize``
hand a backend.

A backend that can show how its model tokenizes declares ``Feature.TOKENIZE`` in
``info()`` and implements ``TextTokenizer``. A tokenize request holds either a prompt
or chat messages (rendered with the model's chat template first, as a chat request
would be); the result holds the token ids, optionally their token strings, and the
model's context length. No model runs: the answer comes from the tokenizer alone.
Plain frozen data, like ``backends.base``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from backends.base import ChatMessage, ToolSpec


@dataclass(frozen=True, slots=True)
class TokenizeRequest:
    """One validated tokenize call: ``messages`` set (a chat, rendered with the chat
    template, ``tools`` given to it) or else ``prompt`` (text, tokenised as is).
    ``add_special_tokens``: add the tokenizer's own (BOS...) on top; the edge defaults it
    as vLLM does (on for a prompt, off for a chat, whose template writes them).
    ``add_generation_prompt`` and ``continue_final_message`` are the chat template's
    switches (never both)."""

    request_id: str
    model: str
    prompt: str = ""
    messages: tuple[ChatMessage, ...] = ()
    tools: tuple[ToolSpec, ...] = ()
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False


@dataclass(frozen=True, slots=True)
class TokenizeResult:
    """``token_strs`` is set only when asked; ``max_model_len`` is the model's context."""

    tokens: tuple[int, ...]
    max_model_len: int
    token_strs: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class DetokenizeRequest:
    """Token ids to turn back into text (each checked against the vocabulary by the
    backend, which raises ``InvalidRequest`` naming ``tokens``)."""

    request_id: str
    model: str
    tokens: tuple[int, ...]


@runtime_checkable
class TextTokenizer(Protocol):
    """The optional methods of a backend that declares ``Feature.TOKENIZE``. Both run on
    the event loop without blocking it and raise the contract's ``BackendError``
    subclasses (``InvalidRequest`` naming ``messages`` for a chat the model cannot
    render, ``tokens`` for an id outside the vocabulary, ``NotReady`` before ``start``)."""

    async def tokenize(self, request: TokenizeRequest) -> TokenizeResult: ...

    async def detokenize(self, request: DetokenizeRequest) -> str: ...
