"""``EngineSuite``: the checks every model must pass with ``llmso serve`` in front of it,
driven by the official ``openai`` SDK (the HTTP-level sibling of ``BackendContract``).

A test module subclasses it, sets ``model_name`` and ``max_tokens``, implements
``rejected_call`` (a call the model's backend answers with a 4xx) and provides a
``server`` fixture (the gateway, module-scoped). The gateway's own output is checked
against the OpenAI schemas on every engine.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.tools.schemas import validate
from tests.tools.servers import RunningServer


class EngineSuite:
    """SDK checks through the gateway; subclasses set ``model_name`` and ``max_tokens``,
    implement ``rejected_call`` (a call the engine answers with a 4xx), and their module
    provides a ``server`` fixture (the gateway in front of the engine)."""

    model_name = ""
    client_timeout = 120.0
    max_tokens = 8
    rejected_status = 400
    rejected_snippet = "context"
    """Lower-case text the upstream's own error message contains (proves it was relayed)."""
    answer_snippet: str | None = None
    """Text the greedy answer to the capital-of-France question contains, if known."""
    min_prompt_tokens = 1
    stream_usage_matches = False
    """Whether a greedy stream reports the same finish reason and completion tokens as
    the same request without streaming (true where the gateway owns the counting)."""

    @pytest.fixture(scope="class")
    def client(self, server: RunningServer) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=server.url + "/v1",
            api_key="unused",
            max_retries=0,
            timeout=self.client_timeout,
        )

    @pytest.fixture(scope="class")
    def model(self) -> str:
        return self.model_name

    def rejected_call(self, client: openai.OpenAI, model: str) -> object:
        raise NotImplementedError

    def _chat(self, client: openai.OpenAI, model: str, **kw: Any) -> Any:
        return client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=self.max_tokens,
            temperature=0,
            **kw,
        )

    def test_chat_non_stream(self, client: openai.OpenAI, model: str) -> None:
        reply = self._chat(client, model)
        validate("CreateChatCompletionResponse", reply.model_dump(exclude_unset=True))
        assert reply.model == model and reply.id.startswith("chatcmpl-")
        assert reply.choices[0].message.content
        if self.answer_snippet is not None:
            assert self.answer_snippet in reply.choices[0].message.content
        assert reply.choices[0].finish_reason in ("stop", "length")
        assert reply.usage is not None
        assert reply.usage.prompt_tokens >= self.min_prompt_tokens
        assert 0 < reply.usage.completion_tokens <= self.max_tokens

    def test_chat_stream_with_usage(self, client: openai.OpenAI, model: str) -> None:
        chunks = list(
            self._chat(client, model, stream=True, stream_options={"include_usage": True})
        )
        for chunk in chunks:
            validate("CreateChatCompletionStreamResponse", chunk.model_dump(exclude_unset=True))
        roles = [c.choices[0].delta.role for c in chunks if c.choices and c.choices[0].delta.role]
        assert roles == ["assistant"]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text
        finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finishes[-1] in ("stop", "length")
        usage = chunks[-1].usage
        assert usage is not None and 0 < usage.completion_tokens <= self.max_tokens
        assert usage.prompt_tokens > 0

    def test_completions(self, client: openai.OpenAI, model: str) -> None:
        reply = client.completions.create(
            model=model, prompt="The capital of France is", max_tokens=self.max_tokens,
            temperature=0,
        )  # fmt: skip
        assert reply.choices[0].text
        assert reply.usage is not None and 0 < reply.usage.completion_tokens <= self.max_tokens

    def test_greedy_stream_equals_non_stream(self, client: openai.OpenAI, model: str) -> None:
        reply = self._chat(client, model)
        whole = reply.choices[0].message.content
        chunks = list(
            self._chat(client, model, stream=True, stream_options={"include_usage": True})
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole
        if self.stream_usage_matches:
            assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2
            reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
            assert [r for r in reasons if r] == [reply.choices[0].finish_reason]
            usage = chunks[-1].usage
            assert usage is not None and reply.usage is not None
            assert usage.completion_tokens == reply.usage.completion_tokens

    def test_upstream_rejection_is_mapped(self, client: openai.OpenAI, model: str) -> None:
        with pytest.raises(openai.APIStatusError) as info:
            self.rejected_call(client, model)
        assert info.value.status_code == self.rejected_status, info.value.body
        body = info.value.body
        assert isinstance(body, dict), body
        error = body.get("error", body)
        assert isinstance(error, dict) and error.get("message"), body
        assert self.rejected_snippet in str(error["message"]).lower(), error
