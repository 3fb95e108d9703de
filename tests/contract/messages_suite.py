"""``MessagesSuite``: the Anthropic Messages API through ``llmso serve``, driven by the
official ``anthropic`` SDK (plain create, the ``messages.stream`` helper, a tool loop,
``count_tokens``, ``stop_sequences``, a typed error). Mixed into an engine module's
``EngineSuite`` class, whose module provides the ``server`` fixture and whose
``model_name`` it uses, so no server is started for it. The gateway translates onto its
chat contract on every backend (an ``openai`` upstream gets chat, never its own
``/v1/messages``). Assertions are on shapes, stop reasons and token counts, never on
wording.
"""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from anthropic.types import Message

from tests.tools.servers import RunningServer
from tests.tools.tool_cases import ASK
from tests.tools.tool_cases import WEATHER as CHAT_WEATHER

# The chat suites' get_weather tool, in Anthropic's shape.
WEATHER: Any = {
    "name": CHAT_WEATHER["function"]["name"],
    "description": CHAT_WEATHER["function"]["description"],
    "input_schema": CHAT_WEATHER["function"]["parameters"],
}
QUESTION: Any = [{"role": "user", "content": "What is the capital of France?"}]
# An ask no answer finishes within ``messages_max_tokens``: the text runs to the limit, so
# it has words after its first to stop at.
STORY: Any = [{"role": "user", "content": "Write a long story about a cat."}]
GREEDY = {"temperature": 0}  # not a named argument of this SDK release: sent as extra body


class MessagesSuite:
    model_name = ""
    messages_max_tokens = 8
    tool_max_tokens = 48
    """Enough for a forced call's arguments where the engine does not close them early."""
    client_timeout = 120.0
    image_input = False
    """Whether the backend declares image input (else image blocks are a 400)."""
    names_stop_sequence = True
    """Whether the backend says which stop string ended a choice (else ``end_turn``)."""
    forced_call_is_an_object = True
    """Whether a forced call's arguments hold to the tool's schema (an object)."""

    @pytest.fixture(scope="class")
    def anthropic_client(self, server: RunningServer) -> anthropic.Anthropic:
        return anthropic.Anthropic(
            base_url=server.url, api_key="unused", max_retries=0, timeout=self.client_timeout
        )

    def test_messages_create_and_count_tokens(self, anthropic_client: anthropic.Anthropic) -> None:
        raw = anthropic_client.messages.with_raw_response.create(
            model=self.model_name,
            max_tokens=self.messages_max_tokens,
            system="Answer in one short sentence.",
            messages=QUESTION,
            extra_body=GREEDY,
        )
        Message.model_validate(raw.http_response.json())
        message = raw.parse()
        assert message.id.startswith("msg_") and message.model == self.model_name
        [block] = message.content
        assert block.type == "text" and block.text
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert 0 < message.usage.output_tokens <= self.messages_max_tokens
        self._check_stop_sequence(anthropic_client)
        counted = anthropic_client.messages.count_tokens(
            model=self.model_name, system="Answer in one short sentence.", messages=QUESTION
        )
        # Anthropic's input_tokens leaves out the prompt tokens read from a cache.
        usage = message.usage
        assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
        assert counted.input_tokens > 0

    def _check_stop_sequence(self, client: anthropic.Anthropic) -> None:
        """A greedy answer that runs to max_tokens, then the same request stopped at its
        second word: cut before it."""
        ask: dict[str, Any] = {
            "model": self.model_name,
            "max_tokens": self.messages_max_tokens,
            "messages": STORY,
            "extra_body": GREEDY,
        }
        full = client.messages.create(**ask)
        answer = full.content[0].text  # type: ignore[union-attr]
        assert (full.stop_reason, full.usage.output_tokens) == (
            "max_tokens",
            self.messages_max_tokens,
        ), answer
        words = answer.split()
        assert len(words) >= 2, f"{answer!r}: {self.messages_max_tokens} tokens, one word"
        stop = words[1]
        message = client.messages.create(**ask, stop_sequences=[stop])
        assert message.content[0].text == answer[: answer.find(stop)]  # type: ignore[union-attr]
        if self.names_stop_sequence:
            assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", stop)
        else:
            assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)

    def test_messages_stream_helper(self, anthropic_client: anthropic.Anthropic) -> None:
        with anthropic_client.messages.stream(
            model=self.model_name,
            max_tokens=self.messages_max_tokens,
            messages=QUESTION,
            extra_body=GREEDY,
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text and [block.type for block in final.content] == ["text"]
        assert final.content[0].text == text  # type: ignore[union-attr]
        assert final.stop_reason in ("end_turn", "max_tokens")
        assert final.usage.input_tokens > 0
        assert 0 < final.usage.output_tokens <= self.messages_max_tokens

    def test_messages_tool_loop(self, anthropic_client: anthropic.Anthropic) -> None:
        """tool_use (forced, so a small model calls reliably) → tool_result → text."""
        first = anthropic_client.messages.create(
            model=self.model_name,
            max_tokens=self.tool_max_tokens,
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather"},
            messages=ASK,
            extra_body=GREEDY,
        )
        assert first.stop_reason == "tool_use", first
        call = first.content[-1]
        assert call.type == "tool_use" and call.name == "get_weather"
        assert call.id.startswith("toolu_") and isinstance(call.input, dict), first
        if self.forced_call_is_an_object:
            assert isinstance(call.input.get("city"), str), first
        answer = anthropic_client.messages.create(
            model=self.model_name,
            max_tokens=8,
            tools=[WEATHER],
            tool_choice={"type": "none"},
            messages=[
                *ASK,
                {"role": "assistant", "content": first.content},  # type: ignore[typeddict-item]
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": call.id, "content": "sunny, 12 C"}
                    ],
                },
            ],
            extra_body=GREEDY,
        )
        assert [block.type for block in answer.content] == ["text"]
        assert answer.content[0].text  # type: ignore[union-attr]
        assert answer.stop_reason in ("end_turn", "max_tokens")
        assert answer.usage.input_tokens > 0

    def test_messages_missing_max_tokens(self, anthropic_client: anthropic.Anthropic) -> None:
        with pytest.raises(anthropic.BadRequestError) as bad:
            anthropic_client.messages.create(
                model=self.model_name,
                messages=QUESTION,
                max_tokens=anthropic.NOT_GIVEN,  # type: ignore[arg-type]
            )
        assert bad.value.status_code == 400
        assert bad.value.body == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": "max_tokens: Field required"},
        }

    def test_messages_image_block_without_vision(
        self, anthropic_client: anthropic.Anthropic
    ) -> None:
        if self.image_input:
            pytest.skip("this backend declares image input")
        image = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
        with pytest.raises(anthropic.BadRequestError) as bad:
            anthropic_client.messages.create(
                model=self.model_name,
                max_tokens=4,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is in this picture?"},
                            {"type": "image", "source": image},
                        ],
                    }
                ],
            )
        error = bad.value.body["error"]  # type: ignore[index]
        assert error["type"] == "invalid_request_error"
        assert error["message"].startswith("messages[0].content[1]: ")
        assert "image_input" in error["message"]
