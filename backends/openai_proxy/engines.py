"""Known upstream kinds and the differences the proxy smooths over.

Every engine speaks the OpenAI wire format, but not quite the same dialect:

- vLLM honours ``stream_options.include_usage`` and has a cheap ``/health``.
- llama.cpp (llama-cpp-python) ignores ``include_usage``; its streams carry no usage, so
  the proxy counts tokens itself (see ``stream.ChunkTranslator``). It also answers a
  streaming request it rejects (prompt past its context) with an empty 200 stream. It
  applies a repeat penalty of 1.1 unless told otherwise, which OpenAI's API has not: the
  body asks for 1.0 (a client's own ``repeat_penalty`` wins). That is OpenAI's meaning
  of the same request, and it keeps a resumed answer exact: llama.cpp penalises only the
  tokens it generated itself, so the part of an answer sent back as prompt
  (``resume``) would otherwise stop counting, and greedy continuations diverged at
  every cut tried.
- mlx-lm answers ``/v1/models`` with an empty list unless ``HF_HUB_CACHE`` exists, needs
  the served *path* as ``model``, and labels its usage chunk ``object: chat.completion``;
  the stream parser never looks at ``object``, so only the health path differs.

Features (``EngineProfile.features``): what the proxy forwards for the upstream to
honour. vLLM does tools and both JSON modes, but ``tool_choice: auto`` only when started
with ``--enable-auto-tool-choice --tool-call-parser hermes`` (or the parser of the
model's family); ``required``/named tool choice and ``json_schema`` go through its
structured outputs (xgrammar) without flags. llama-cpp-python honours both JSON modes
and ``logit_bias``; its tool calling depends on the chat format, so it is not claimed.
mlx-lm claims nothing beyond text. A ``generic`` upstream is assumed to be OpenAI-like.
Prompt log-probabilities (``echo`` with ``logprobs``, ``prompt_logprobs``) only from vLLM
(its ``prompt_logprobs``, ``scored.py``): llama-cpp-python echoes log-probabilities only
when not streaming and pairs each prompt token with the distribution its own position
produces (one position late); OpenAI's own API no longer scores prompts; mlx-lm has none.
Reasoning (``Feature.REASONING``): every engine's thought fields are read, and the effort
and the thinking switch are forwarded for the upstream to apply or ignore (as vLLM
ignores an effort its template does not take); a thinking budget only to vLLM, as its
``thinking_token_budget`` (it needs vLLM's own ``--reasoning-parser``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from backends.base import TEXT_GENERATION, Feature

EngineKind = Literal["generic", "vllm", "llamacpp", "mlx"]


@dataclass(frozen=True, slots=True)
class EngineProfile:
    kind: EngineKind
    health_path: str
    """Path under the server root (not under ``/v1``) probed by health checks."""
    accepts_ignore_eos: bool
    """Whether the body may carry vLLM's ``ignore_eos`` extension."""
    hides_stream_errors: bool = False
    """Whether a rejected streaming request comes back as an empty 200 stream; the real
    error is then fetched by asking again without streaming."""
    features: frozenset[Feature] = TEXT_GENERATION
    """What the upstream honours of what the proxy forwards (see the module docstring)."""
    body_defaults: tuple[tuple[str, float], ...] = ()
    """Fields every request body carries unless the client set them."""
    sends_priority: bool = False
    """Whether the body carries the request's ``priority`` (when not 0, vLLM's default):
    the model's ``send_priority``, for a vLLM that schedules by it."""


_JSON = frozenset({Feature.JSON_OBJECT, Feature.JSON_SCHEMA, Feature.LOGIT_BIAS})
_REASONING = frozenset({Feature.REASONING, Feature.REASONING_EFFORT, Feature.THINKING_SWITCH})
_TEXT = TEXT_GENERATION | _REASONING
_OPENAI_LIKE = _TEXT | _JSON | {Feature.TOOLS, Feature.IMAGE_INPUT, Feature.OTHER_INPUT}
_VLLM = _OPENAI_LIKE | {Feature.PROMPT_LOGPROBS, Feature.THINKING_BUDGET}
_PROFILES: dict[str, EngineProfile] = {
    "generic": EngineProfile("generic", "/v1/models", False, features=_OPENAI_LIKE),
    "vllm": EngineProfile("vllm", "/health", True, features=_VLLM),
    "llamacpp": EngineProfile(
        "llamacpp",
        "/v1/models",
        False,
        True,
        _TEXT | _JSON,
        body_defaults=(("repeat_penalty", 1.0),),
    ),
    "mlx": EngineProfile("mlx", "/health", False, features=_TEXT),
}


def profile_for(
    kind: str, health_path: str | None = None, *, send_priority: bool = False
) -> EngineProfile:
    """The profile of ``kind``; ``health_path`` overrides the default probe path."""
    base = _PROFILES[kind]
    if send_priority:
        base = replace(base, sends_priority=True)
    if health_path is None:
        return base
    path = health_path if health_path.startswith("/") else f"/{health_path}"
    return replace(base, health_path=path)


def split_base_url(base_url: str) -> tuple[str, str]:
    """``(server_root, api_root)`` for a configured base URL.

    Accepts both ``http://h:p`` and ``http://h:p/v1`` (the OpenAI SDK convention): the API
    root always ends in ``/v1``; health paths hang off the server root.
    """
    url = base_url.rstrip("/")
    if url.endswith("/v1"):
        return url[: -len("/v1")], url
    return url, f"{url}/v1"
