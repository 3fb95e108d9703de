"""End to end: a reasoning model on the hf engine through ``llmso serve``, with real
clients: the OpenAI SDK (chat whole and streamed, Responses), the anthropic SDK with
``thinking`` and a budget, and the Agents SDK with a reasoning setting; and the same
model in a worker process (``isolation: process``), which carries the split.

The model is the tiny random Qwen3 of ``tests.tools.reasoning_model`` (its template opens
``<think>`` as DeepSeek-R1's does), served with ``reasoning_parser: deepseek_r1`` under
``EFFORT_TEMPLATE`` (the same, plus a system line reading ``reasoning_effort``, so an
effort is honoured). Greedy. Random weights never close a thought on their own: a
thinking budget closes it (the engine forces ``</think>``), or the thought runs to
``max_tokens`` with no answer.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from prometheus_client import CollectorRegistry

from backends.base import (
    ChatMessage,
    Feature,
    GenerationRequest,
    ReasoningControls,
    RequestKind,
    SamplingParams,
)
from backends.hop_metrics import BackendMetrics
from backends.process.backend import ProcessBackend
from config.schema import HFModelConfig
from tests.contract.events import collect
from tests.tools.engines import model_folder
from tests.tools.reasoning_model import EFFORT_TEMPLATE, build
from tests.tools.servers import WORKER_ENV, RunningServer, gateway

pytestmark = pytest.mark.e2e

MODEL = "tiny-thinker"
ASK = [{"role": "user", "content": "Why is the sky blue?"}]
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 0}
MARKERS = ("<think>", "</think>")


def _model(folder: Path) -> dict[str, Any]:
    return {
        "name": MODEL,
        "backend": "hf",
        "source": str(folder),
        "dtype": "float32",
        "max_context": 1024,
        "threads": 1,
        "reasoning_parser": "deepseek_r1",
        "chat_template": EFFORT_TEMPLATE,
    }


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(model_folder(), tmp_path_factory.mktemp("thinker"))


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[RunningServer]:
    with gateway({"models": [_model(folder)]}) as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _extra(obj: Any, name: str) -> str | None:
    value = (obj.model_extra or {}).get(name)
    return value if isinstance(value, str) else None


def _no_markers(*texts: str) -> None:
    for text in texts:
        assert not any(marker in text for marker in MARKERS), text


def _chat(client: openai.OpenAI, *, stream: bool) -> tuple[str, str, int]:
    """(thought, answer, reasoning tokens) under a thinking budget of 6."""
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": ASK,
        "max_tokens": 16,
        "extra_body": {"thinking_token_budget": 6},
        **GREEDY,
    }
    if not stream:
        reply = client.chat.completions.create(**request)
        message = reply.choices[0].message
        thought = _extra(message, "reasoning_content") or ""
        assert _extra(message, "reasoning") == thought
        assert reply.usage is not None and reply.usage.completion_tokens_details is not None
        tokens = reply.usage.completion_tokens_details.reasoning_tokens or 0
        return thought, message.content or "", tokens
    chunks = client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    )
    thought, answer, tokens = [], [], 0
    for chunk in chunks:
        if chunk.usage is not None and chunk.usage.completion_tokens_details is not None:
            tokens = chunk.usage.completion_tokens_details.reasoning_tokens or 0
        for choice in chunk.choices:
            piece = _extra(choice.delta, "reasoning_content") or ""
            assert (_extra(choice.delta, "reasoning") or "") == piece
            assert not (piece and choice.delta.content)  # a delta is one or the other
            thought.append(piece)
            answer.append(choice.delta.content or "")
    return "".join(thought), "".join(answer), tokens


def test_chat_whole_and_streamed_give_the_same_split(client: openai.OpenAI) -> None:
    whole = _chat(client, stream=False)
    thought, answer, tokens = whole
    assert thought.strip() and answer.strip()
    _no_markers(thought, answer)
    assert tokens == 6  # the budget, closing included
    assert _chat(client, stream=True) == whole
    # The template cannot switch the thought off: refused, naming the field.
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL,
            messages=ASK,  # type: ignore[arg-type]
            max_tokens=4,
            extra_body={"chat_template_kwargs": {"enable_thinking": False}},
        )
    assert caught.value.body["param"] == "chat_template_kwargs"  # type: ignore[index]


def test_responses_has_a_reasoning_item_and_honours_the_effort(client: openai.OpenAI) -> None:
    plain = client.responses.create(
        model=MODEL, input=ASK[0]["content"], max_output_tokens=12, temperature=0
    )
    item = plain.output[0]
    assert item.type == "reasoning" and item.summary == []
    assert item.content is not None and item.content[0].text.strip()
    _no_markers(item.content[0].text, plain.output_text)
    assert plain.usage is not None
    assert plain.usage.output_tokens_details.reasoning_tokens == 12  # cut inside the thought
    assert plain.status == "incomplete"
    effort = client.responses.create(
        model=MODEL,
        input=ASK[0]["content"],
        max_output_tokens=12,
        temperature=0,
        reasoning={"effort": "low"},
    )
    # The template's "Reasoning: low" line made the prompt longer.
    assert effort.usage is not None and effort.usage.input_tokens > plain.usage.input_tokens


def test_messages_thinking_block_with_a_budget(server: RunningServer) -> None:
    claude = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    message = claude.messages.create(
        model=MODEL,
        max_tokens=24,
        messages=ASK,  # type: ignore[arg-type]
        thinking={"type": "enabled", "budget_tokens": 8},
        extra_body={"temperature": 0},
    )
    thinking, *rest = message.content
    assert thinking.type == "thinking" and thinking.thinking.strip() and thinking.signature
    texts = "".join(block.text for block in rest if block.type == "text")
    assert texts.strip()
    _no_markers(thinking.thinking, texts)
    assert message.usage.output_tokens == 24
    # The template cannot switch the thought off: refused, naming the field.
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude.messages.create(
            model=MODEL,
            max_tokens=24,
            messages=ASK,  # type: ignore[arg-type]
            thinking={"type": "disabled"},
        )
    assert "thinking.type" in str(caught.value)


async def test_agents_sdk_with_a_reasoning_setting_runs_a_turn(server: RunningServer) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        set_tracing_disabled,
    )
    from agents.items import ReasoningItem
    from openai.types.shared import Reasoning

    set_tracing_disabled(True)
    sdk = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    agent = Agent(
        name="thinker",
        instructions="Answer briefly.",
        model=OpenAIChatCompletionsModel(model=MODEL, openai_client=sdk),
        model_settings=ModelSettings(
            reasoning=Reasoning(effort="low"),
            temperature=0,
            max_tokens=16,
            extra_body={"thinking_token_budget": 6},
        ),
    )
    result = await Runner.run(agent, ASK[0]["content"], max_turns=1)
    assert isinstance(result.final_output, str) and result.final_output.strip()
    _no_markers(result.final_output)
    assert any(isinstance(item, ReasoningItem) for item in result.new_items)


async def test_a_worker_process_carries_the_split(folder: Path) -> None:
    config = HFModelConfig(**_model(folder), isolation="process", load_timeout=300)
    worker = ProcessBackend(config, BackendMetrics(CollectorRegistry()), env=WORKER_ENV)
    await worker.start()
    try:
        assert {Feature.REASONING, Feature.THINKING_BUDGET} <= worker.info().features
        request = GenerationRequest(
            request_id="e2e",
            model=MODEL,
            kind=RequestKind.CHAT,
            sampling=SamplingParams(max_tokens=16, temperature=0.0),
            messages=(ChatMessage("user", ASK[0]["content"]),),
            reasoning=ReasoningControls(budget_tokens=6),
        )
        result = await collect(worker.generate(request))
        assert result.thought().strip() and result.text().strip()
        _no_markers(result.thought(), result.text())
        assert result.usage.reasoning_tokens == 6 and result.usage.completion_tokens == 16
    finally:
        await worker.stop()
