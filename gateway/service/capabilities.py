"""Feature checks: a request the routed backend cannot honour is refused with a 400.

Which features a request needs is read off the ``GenerationRequest`` here, in one place;
what a backend can honour is its own declaration, ``ModelInfo.features``. The service runs
the check after routing and before the backend sees the request, so a fallback model is
checked against its own declaration. A whole endpoint a model does not serve (embeddings,
scoring, tokenizing) is refused the same way, naming the field that chose the model.

Reasoning controls are checked only where the backend declares ``Feature.REASONING`` (the
model thinks, and its thought is split off): a model without a reasoning parser ignores
them, as vLLM does, since clients send ``reasoning_effort`` to every model;
``reasoning_controls`` takes them off such a request and names what it dropped. Switching
thinking on is what a thinking model does anyway and needs nothing.
"""

from __future__ import annotations

from dataclasses import replace

from backends.base import (
    NO_REASONING_CONTROLS,
    Backend,
    Feature,
    GenerationRequest,
    ModelInfo,
    ReasoningControls,
    RequestKind,
    UnsupportedFeature,
)
from backends.embeddings import Embedder
from backends.scoring import Scorer
from backends.tokenizing import TextTokenizer

_REASONING_FEATURES = frozenset(
    {Feature.REASONING_EFFORT, Feature.THINKING_SWITCH, Feature.THINKING_BUDGET}
)


def needed_features(request: GenerationRequest) -> list[tuple[Feature, str]]:
    """Each feature the request needs, with the request field that asks for it."""
    needs: list[tuple[Feature, str]] = []
    if request.kind is RequestKind.CHAT:
        needs.append((Feature.CHAT, "messages"))
    else:
        needs.append((Feature.COMPLETION, "prompt"))
    if request.sampling.logprobs is not None:
        needs.append((Feature.LOGPROBS, "logprobs"))
    if request.prompt_token_ids:
        needs.append((Feature.PROMPT_TOKEN_IDS, "prompt"))
    if request.prompt_logprobs is not None:
        needs.append((Feature.PROMPT_LOGPROBS, "prompt_logprobs"))
    if request.suffix is not None:
        needs.append((Feature.SUFFIX, "suffix"))
    if request.tools:
        needs.append((Feature.TOOLS, "tools"))
    fmt = request.response_format
    if fmt.type == "json_schema" or fmt.schema is not None:  # or json_object + schema
        needs.append((Feature.JSON_SCHEMA, "response_format"))
    elif fmt.type == "json_object":
        needs.append((Feature.JSON_OBJECT, "response_format"))
    if request.logit_bias:
        needs.append((Feature.LOGIT_BIAS, "logit_bias"))
    needs.extend(_message_features(request))
    needs.extend(reasoning_needs(request.reasoning))
    return needs


def reasoning_needs(controls: ReasoningControls) -> list[tuple[Feature, str]]:
    """The features the reasoning controls need, with the chat field that set each (an
    endpoint's ``wire_param`` renames it: ``reasoning.effort``, ``thinking``...)."""
    needs: list[tuple[Feature, str]] = []
    if controls.effort is not None and controls.effort != "none":
        needs.append((Feature.REASONING_EFFORT, "reasoning_effort"))
    if controls.thinking is False:
        param = "reasoning_effort" if controls.effort == "none" else "chat_template_kwargs"
        needs.append((Feature.THINKING_SWITCH, param))
    if controls.budget_tokens is not None:
        needs.append((Feature.THINKING_BUDGET, "thinking_token_budget"))
    return needs


def reasoning_controls(
    request: GenerationRequest, info: ModelInfo
) -> tuple[GenerationRequest, str]:
    """The request as the backend gets it, and the controls it ignores ("" when none): a
    backend without ``Feature.REASONING`` gets none (they are checked, if it has it, by
    ``require_features``)."""
    controls = request.reasoning
    if not controls.asked or Feature.REASONING in info.features:
        return request, ""
    fields = [param for _, param in reasoning_needs(controls)]
    if controls.template_kwargs:
        fields.append("chat_template_kwargs")
    ignored = ",".join(dict.fromkeys(fields)) or "thinking"
    return replace(request, reasoning=NO_REASONING_CONTROLS), ignored


def _message_features(request: GenerationRequest) -> list[tuple[Feature, str]]:
    """Tool turns in the history need TOOLS; image and other parts need their input."""
    needs: list[tuple[Feature, str]] = []
    for index, message in enumerate(request.messages):
        if message.tool_calls or message.role == "tool":
            needs.append((Feature.TOOLS, f"messages[{index}]"))
        for part_index, part in enumerate(message.parts):
            if part.type == "text":
                continue
            feature = Feature.IMAGE_INPUT if part.type == "image_url" else Feature.OTHER_INPUT
            needs.append((feature, f"messages[{index}].content[{part_index}]"))
    return needs


def require_features(request: GenerationRequest, model: str, info: ModelInfo) -> None:
    """Raise ``UnsupportedFeature`` naming the first field whose feature ``info`` lacks."""
    for feature, param in needed_features(request):
        if feature in _REASONING_FEATURES and Feature.REASONING not in info.features:
            continue  # ignored (reasoning_controls): the model has no reasoning parser
        if feature not in info.features:
            if Feature.EMBEDDINGS in info.features:
                raise UnsupportedFeature(
                    f"model '{model}' is an embedding model: it serves /v1/embeddings only, "
                    f"not {feature.value}",
                    param=param,
                )
            raise UnsupportedFeature(
                f"model '{model}' does not support {feature.value}", param=param
            )


def require_embeddings(backend: Backend, model: str, info: ModelInfo) -> Embedder:
    """The backend as an ``Embedder``, or ``UnsupportedFeature`` naming ``input``."""
    if Feature.EMBEDDINGS not in info.features or not isinstance(backend, Embedder):
        raise UnsupportedFeature(
            f"model '{model}' does not support embeddings; it serves chat and completions",
            param="input",
        )
    return backend


def require_scorer(backend: Backend, model: str, info: ModelInfo) -> Scorer:
    """The backend as a ``Scorer``, or ``UnsupportedFeature`` naming ``model``."""
    if Feature.SCORE not in info.features or not isinstance(backend, Scorer):
        raise UnsupportedFeature(
            f"model '{model}' does not serve /v1/score or /v1/rerank: it is not an embedding "
            "model, a cross-encoder, or an upstream declared with the `score` capability",
            param="model",
        )
    return backend


def require_tokenizer(backend: Backend, model: str, info: ModelInfo) -> TextTokenizer:
    """The backend as a ``TextTokenizer``, or ``UnsupportedFeature`` naming ``model``."""
    if Feature.TOKENIZE not in info.features or not isinstance(backend, TextTokenizer):
        raise UnsupportedFeature(
            f"model '{model}' does not serve /tokenize or /detokenize: its backend has no "
            "tokenizer of its own (an upstream needs the `tokenize` capability)",
            param="model",
        )
    return backend
