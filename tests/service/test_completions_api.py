"""Service tier for /v1/completions beyond one prompt: prompt lists (one choice set per
prompt, indexes in order), echo, and the 400s for what a backend does not declare
(token-id prompts and suffix on a backend without those features)."""

from __future__ import annotations

from typing import Any

import httpx

from tests.service.test_gateway_api import assert_error, client, client_for, sse_events
from tests.tools.schemas import validate

__all__ = ["client", "client_for"]  # fixtures


async def complete(client: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await client.post("/v1/completions", json={"model": "alpha", "max_tokens": 5, **body})


async def test_prompt_list_gives_one_choice_set_per_prompt(client: httpx.AsyncClient) -> None:
    response = await complete(client, prompt=["one", "two", "three"], n=2)
    assert response.status_code == 200, response.text
    body = response.json()
    validate("CreateCompletionResponse", body)
    assert [choice["index"] for choice in body["choices"]] == list(range(6))
    assert {choice["text"] for choice in body["choices"]} == {"Hello from alpha"}
    assert body["usage"]["prompt_tokens"] == 3 * 5  # summed over the prompts
    assert body["usage"]["completion_tokens"] == 6 * 3
    calls = client.backends["alpha"].calls  # type: ignore[attr-defined]
    assert [call.prompt for call in calls] == ["one", "two", "three"]


async def test_echo_puts_the_prompt_first_plain_and_streamed(client: httpx.AsyncClient) -> None:
    plain = (await complete(client, prompt=["Say: ", "Then: "], echo=True)).json()
    validate("CreateCompletionResponse", plain)
    assert [choice["text"] for choice in plain["choices"]] == [
        "Say: Hello from alpha",
        "Then: Hello from alpha",
    ]
    streamed = await complete(
        client,
        prompt=["Say: ", "Then: "],
        echo=True,
        stream=True,
        stream_options={"include_usage": True},
    )
    events = sse_events(streamed.text)
    assert events[-1] == "[DONE]"
    texts: dict[int, str] = {}
    for event in events[:-1]:
        validate("CreateCompletionResponse", event)
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "Say: Hello from alpha", 1: "Then: Hello from alpha"}
    assert events[-2]["usage"]["completion_tokens"] == 6


async def test_refusals_name_the_param(client: httpx.AsyncClient) -> None:
    # The scripted backend declares neither token-id prompts nor suffix (like Triton).
    assert_error(await complete(client, prompt=[1, 2, 3]), 400, "unsupported_feature", "prompt")
    assert_error(
        await complete(client, prompt="a", suffix="b"), 400, "unsupported_feature", "suffix"
    )
    assert_error(await complete(client, prompt=[[1], [2]], echo=True), 400, None, "echo")
    # Nor prompt scoring (like Triton): named by the field that asked for it.
    scored = await complete(client, prompt="a", echo=True, logprobs=1, max_tokens=0)
    assert_error(scored, 400, "unsupported_feature", "echo")
    scored = await complete(client, prompt="a", prompt_logprobs=0)
    assert_error(scored, 400, "unsupported_feature", "prompt_logprobs")
    assert_error(await complete(client, prompt="a", max_tokens=0), 400, None, "max_tokens")
    assert_error(await complete(client, prompt="a", n=2, best_of=1), 400, None, "best_of")
    assert_error(await complete(client, prompt=["a"] * 65), 400, None, "prompt")
    assert_error(await complete(client, prompt=["a"] * 2, n=100), 400, None, "prompt")
    assert_error(await complete(client, prompt=[]), 400, None, "prompt")


async def test_a_failing_prompt_fails_the_whole_request(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/completions", json={"model": "busy-one", "prompt": ["a", "b"], "max_tokens": 2}
    )
    # busy-one is always overloaded and falls back to alpha, prompt by prompt.
    assert response.status_code == 200 and len(response.json()["choices"]) == 2
    broken = await client.post("/v1/completions", json={"model": "broken", "prompt": ["a", "b"]})
    assert_error(broken, 503, "upstream_unavailable", None)  # fails mid-way: one error
