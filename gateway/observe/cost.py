"""What an answer costs: its billed tokens at its model's prices (``pricing:``).

Money is an integer count of picodollars (1e-12 USD): a price per million tokens with up
to six decimals is a whole number of picodollars per token, so every cost, sum and
budget is exact, and the memory store and Redis agree to the last digit. USD appear only
at the edges (the ``x-llmso-cost`` header, the log line, metrics, ``/admin/usage``).

The arithmetic (docs/spend.md): prompt tokens read from a prefix cache at
``cached_input``, the other prompt tokens at ``input``, completion tokens (reasoning
included) at ``output``; a batch line's cost less ``batch_discount``.
"""

from __future__ import annotations

from decimal import Decimal

from config.pricing import PricingConfig

PICO_PER_USD = 10**12
_PPM = 1_000_000


def per_token(usd_per_million: float) -> int:
    """A price in USD per million tokens as picodollars per token."""
    return round(usd_per_million * _PPM)


def cost_pico(
    pricing: PricingConfig, prompt: int, cached: int, completion: int, *, batch: bool = False
) -> int:
    """The cost of ``prompt`` tokens (``cached`` of them from a prefix cache) and
    ``completion`` tokens, in picodollars; ``batch``: a batch line, at the discount."""
    cached = max(0, min(cached, prompt))
    cached_rate = pricing.input if pricing.cached_input is None else pricing.cached_input
    total = (
        (prompt - cached) * per_token(pricing.input)
        + cached * per_token(cached_rate)
        + completion * per_token(pricing.output)
    )
    if batch and pricing.batch_discount:
        kept = round((1.0 - pricing.batch_discount) * _PPM)  # parts per million, exact
        total = (total * kept + _PPM // 2) // _PPM
    return total


def usd(pico: int) -> float:
    return pico / PICO_PER_USD


def pico_of_usd(amount: float) -> int:
    """A USD amount from the config (a budget) in picodollars."""
    return round(Decimal(str(amount)) * PICO_PER_USD)


def usd_text(pico: int) -> str:
    """Picodollars as a plain decimal string of USD: ``0.00000315``, ``12.5``, ``0``."""
    return format((Decimal(pico) / PICO_PER_USD).normalize(), "f")
