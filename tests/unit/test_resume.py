"""The pure parts of mid-stream failover (``backends.openai_proxy.resume``): which
requests can be continued, what the delivered answer is, and its usage."""

from __future__ import annotations

from backends.base import (
    ChatMessage,
    Finished,
    GenerationRequest,
    RequestKind,
    ResponseFormat,
    SamplingParams,
    TextDelta,
    ToolCallDelta,
)
from backends.openai_proxy.resume import Resume, failover_mode, refusal
from backends.openai_proxy.stream import ChunkTranslator
from config.schema import OpenAIModelConfig


def _chat(**sampling: object) -> GenerationRequest:
    return GenerationRequest(
        "r",
        "m",
        RequestKind.CHAT,
        SamplingParams(**{"max_tokens": 50, "temperature": 0.0, **sampling}),  # type: ignore[arg-type]
        messages=(ChatMessage("user", "twelve chars"),),
    )


def test_default_mode_follows_the_engine() -> None:
    def mode(**fields: object) -> str:
        config = OpenAIModelConfig(name="m", backend="openai", base_url="http://h", **fields)  # type: ignore[arg-type]
        return failover_mode(config)

    assert mode(engine="vllm") == mode(engine="llamacpp") == "mid_stream"
    assert mode() == mode(engine="mlx") == "before_first_byte"
    assert mode(engine="vllm", failover="off") == "off"


def test_refusals() -> None:
    assert refusal(_chat(), "vllm", renders_chat=False) is None
    assert refusal(_chat(), "generic", renders_chat=False) is None
    assert refusal(_chat(), "llamacpp", renders_chat=False) == "engine"
    assert refusal(_chat(), "llamacpp", renders_chat=True) is None
    assert refusal(_chat(), "mlx", renders_chat=True) == "engine"
    assert refusal(_chat(n=2), "vllm", renders_chat=False) == "n"
    assert refusal(_chat(logprobs=0), "vllm", renders_chat=False) == "logprobs"
    fmt = GenerationRequest(
        "r", "m", RequestKind.CHAT, SamplingParams(max_tokens=5),
        response_format=ResponseFormat("json_object"),
    )  # fmt: skip
    assert refusal(fmt, "vllm", renders_chat=False) == "response_format"
    ids = GenerationRequest(
        "r", "m", RequestKind.COMPLETION, SamplingParams(max_tokens=5), prompt_token_ids=(1, 2)
    )
    assert refusal(ids, "mlx", renders_chat=False) == "token_ids"


def test_the_delivered_answer_and_its_usage() -> None:
    resume = Resume(None)
    resume.record([TextDelta(0, "Hello", num_tokens=1), TextDelta(0, " big world", num_tokens=2)])
    assert (resume.text, resume.tokens, resume.complete(_chat())) == ("Hello big world", 3, False)
    assert resume.tokens_left(_chat()) == 47
    resume.points.append(resume.tokens)
    resume.record([TextDelta(0, "!", num_tokens=1), Finished(0, "stop")])
    assert resume.complete(_chat()) and resume.closing() == []
    # With the upstream's counts: its prompt less the tokens carried is billed once.
    final = ChunkTranslator(chat=True, n=1)
    final.usage = (20, 1)
    usage = resume.usage(final, _chat(), waited=0.5)
    assert (usage.prompt_tokens, usage.completion_tokens) == (17, 4)
    assert (usage.resumes, usage.resume_prompt_tokens, usage.upstream_seconds) == (1, 20, 0.5)
    # Without (llama.cpp): the estimate, and every delivered token counted once.
    usage = resume.usage(ChunkTranslator(chat=True, n=1), _chat(), waited=0.0)
    assert (usage.prompt_tokens, usage.completion_tokens) == (7, 4)
    assert usage.resume_prompt_tokens == 7 + 3


def test_a_tool_call_or_the_length_limit_is_seen() -> None:
    resume = Resume(None)
    resume.record([ToolCallDelta(0, 0, "call_1", "f", "{")])
    assert resume.tool_call
    full = Resume(None)
    full.record([TextDelta(0, "x", num_tokens=50)])
    assert full.complete(_chat()) and full.closing() == [Finished(0, "length")]
