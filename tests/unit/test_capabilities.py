"""Which features a request needs, and the param each refusal names."""

from __future__ import annotations

import pytest

from backends.base import (
    TEXT_GENERATION,
    ChatMessage,
    ContentPart,
    Feature,
    GenerationRequest,
    ModelInfo,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolSpec,
    UnsupportedFeature,
)
from gateway.service.capabilities import needed_features, require_features


def _chat(**fields: object) -> GenerationRequest:
    messages = fields.pop("messages", (ChatMessage("user", "hi"),))
    return GenerationRequest(
        request_id="r",
        model="m",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=4),
        messages=messages,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("request_", "feature", "param"),
    [
        (_chat(tools=(ToolSpec("f"),)), Feature.TOOLS, "tools"),
        (
            _chat(response_format=ResponseFormat("json_object")),
            Feature.JSON_OBJECT,
            "response_format",
        ),
        (
            _chat(response_format=ResponseFormat("json_schema", name="x", schema={})),
            Feature.JSON_SCHEMA,
            "response_format",
        ),
        (
            _chat(response_format=ResponseFormat("json_object", schema="{}")),
            Feature.JSON_SCHEMA,
            "response_format",
        ),
        (_chat(logit_bias=(("42", 5.0),)), Feature.LOGIT_BIAS, "logit_bias"),
        (
            _chat(
                messages=(
                    ChatMessage("user", "q"),
                    ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "f", "{}"),)),
                )
            ),
            Feature.TOOLS,
            "messages[1]",
        ),
        (
            _chat(messages=(ChatMessage("tool", "42", tool_call_id="call_1"),)),
            Feature.TOOLS,
            "messages[0]",
        ),
        (
            _chat(
                messages=(
                    ChatMessage(
                        "user",
                        "look",
                        parts=(
                            ContentPart("text", '{"type": "text", "text": "look"}'),
                            ContentPart("image_url", '{"type": "image_url"}'),
                        ),
                    ),
                )
            ),
            Feature.IMAGE_INPUT,
            "messages[0].content[1]",
        ),
    ],
)
def test_each_feature_names_its_param(
    request_: GenerationRequest, feature: Feature, param: str
) -> None:
    assert (feature, param) in needed_features(request_)
    with pytest.raises(UnsupportedFeature) as caught:
        require_features(request_, "m", ModelInfo(features=TEXT_GENERATION))
    assert caught.value.param == param
    require_features(request_, "m", ModelInfo(features=TEXT_GENERATION | {feature}))


def test_plain_chat_needs_only_chat() -> None:
    assert needed_features(_chat()) == [(Feature.CHAT, "messages")]


async def test_prompt_scoring_is_declared_where_it_is_computed() -> None:
    """Prompt log-probabilities: the hf engine (not in static mode) and vLLM behind the
    openai backend; not llama.cpp, mlx-lm, a generic upstream or Triton."""
    from prometheus_client import CollectorRegistry

    from backends.hf.backend import HFBackend
    from backends.hop_metrics import BackendMetrics
    from backends.openai_proxy.engines import profile_for
    from backends.triton.backend import TritonBackend
    from config.schema import TritonModelConfig
    from tests.hf.helpers import config

    scored = GenerationRequest(
        request_id="r",
        model="m",
        kind=RequestKind.COMPLETION,
        sampling=SamplingParams(max_tokens=0),
        prompt="p",
        prompt_logprobs=1,
    )
    assert (Feature.PROMPT_LOGPROBS, "prompt_logprobs") in needed_features(scored)
    assert Feature.PROMPT_LOGPROBS in HFBackend(config()).info().features
    assert Feature.PROMPT_LOGPROBS not in HFBackend(config(scheduling="static")).info().features
    assert Feature.PROMPT_LOGPROBS in profile_for("vllm").features
    for engine in ("llamacpp", "mlx", "generic"):
        assert Feature.PROMPT_LOGPROBS not in profile_for(engine).features
    triton = TritonBackend(
        TritonModelConfig(name="t", backend="triton", triton_model="llm", url="a:1"),
        BackendMetrics(CollectorRegistry()),
    )
    with pytest.raises(UnsupportedFeature) as caught:
        require_features(scored, "t", triton.info())
    assert caught.value.param == "prompt_logprobs"
    await triton.stop()
