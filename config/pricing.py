"""Config of spend: a model's prices (``pricing:`` on any model entry), read by
``gateway.observe.cost``; per-key budgets are ``max_budget`` / ``budget_period`` on the
client keys (``config.frontdoor``). docs/spend.md has the arithmetic.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PricingConfig(BaseModel):
    """A model's prices in USD per million tokens (kept to 1e-6 USD per million)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(
        ge=0,
        description="USD per million prompt tokens not read from a prefix cache (an "
        "embedding request's input tokens too).",
    )
    cached_input: float | None = Field(
        None,
        ge=0,
        description="USD per million prompt tokens read from a prefix cache (hf prefix-cache "
        "hits, an upstream's prompt_tokens_details.cached_tokens); default: `input`.",
    )
    output: float = Field(
        0.0, ge=0, description="USD per million completion tokens, reasoning tokens included."
    )
    batch_discount: float = Field(
        0.0,
        ge=0,
        le=1,
        description="The fraction taken off the price of a /v1/batches line: 0.5 halves it, "
        "0 (default) charges batch lines like online requests.",
    )
