"""End to end: the shipped default model (``config/default.yaml``'s SmolLM2 entry, with
prices added) under ``llmso serve``: a second request sharing a long prompt prefix with
the first reads it from the hf prefix cache, reports those tokens as cached in every
API's usage (chat, Responses, Messages), and pays the cached price for them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
import yaml

from config.loader import DEFAULT_CONFIG
from config.pricing import PricingConfig
from gateway.observe.cost import cost_pico, usd_text
from tests.tools.servers import RunningServer, gateway

pytestmark = pytest.mark.e2e

PRICES = {"input": 1.0, "cached_input": 0.1, "output": 4.0}
SYSTEM = (
    "You are a careful assistant for a public library. You answer questions about opening "
    "hours, borrowing rules, late fees, room bookings and the catalogue. Opening hours are "
    "nine to six on weekdays and ten to four on Saturdays; the library is closed on Sundays "
    "and public holidays. Members may borrow up to twelve items for three weeks and renew "
    "them twice online unless someone else has reserved them. Late fees are twenty cents a "
    "day per item, capped at five euros. Study rooms seat four and can be booked for two "
    "hours at a time. Answer in one short sentence."
)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    shipped = yaml.safe_load(DEFAULT_CONFIG.read_text())
    default = shipped["models"][0]  # the default chat model, as shipped
    assert "default" in default["aliases"]
    config: dict[str, Any] = {"models": [{**default, "pricing": PRICES}]}
    with gateway(config) as running:
        yield running


def ask(client: openai.OpenAI, question: str) -> tuple[Any, str]:
    raw = client.chat.completions.with_raw_response.create(
        model="default",
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        max_tokens=4,
        temperature=0,
    )
    return raw.parse(), raw.headers["x-llmso-cost"]


def test_a_shared_prefix_is_reported_cached_and_priced_so(server: RunningServer) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    ask(client, "When do you open on Saturday?")  # fills the cache with the system prompt
    answer, cost = ask(client, "How much is a late fee?")
    usage = answer.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens or 0
    # The system prompt is ~115 tokens: whole 16-token blocks of it came from the cache.
    assert 96 <= cached < usage.prompt_tokens and cached % 16 == 0
    pricing = PricingConfig(**PRICES)
    billed = cost_pico(pricing, usage.prompt_tokens, cached, usage.completion_tokens)
    assert cost == usd_text(billed)
    assert billed < cost_pico(pricing, usage.prompt_tokens, 0, usage.completion_tokens)

    responses = client.responses.create(
        model="default",
        instructions=SYSTEM,
        input="Can I book a study room?",
        max_output_tokens=4,
        temperature=0,
    )
    assert responses.usage is not None
    assert responses.usage.input_tokens_details.cached_tokens >= 96

    messages = anthropic.Anthropic(
        base_url=server.url, api_key="unused", max_retries=0
    ).messages.create(
        model="default",
        system=SYSTEM,
        messages=[{"role": "user", "content": "How many items may I borrow?"}],
        max_tokens=4,
    )
    assert (messages.usage.cache_read_input_tokens or 0) >= 96
    assert messages.usage.input_tokens < 60  # the question and the template, not the prefix
