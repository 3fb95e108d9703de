"""Spend: the cost arithmetic (cached and uncached prompt tokens, output, the batch
discount, exact picodollars), the calendar UTC periods of budgets (day, week from Monday,
month ends and leap years), the spend budget in the in-process store with an explicit
clock, a record's billed tokens and the refusal's message."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from config.frontdoor import AuthConfig, BudgetPeriod, KeyConfig
from config.pricing import PricingConfig
from gateway.access.admission import budget_message
from gateway.access.keys import KeyRing
from gateway.access.limits import Ask, KeyLimits, MemoryStore, Settlement
from gateway.access.periods import DAY, bounds
from gateway.observe.cost import PICO_PER_USD, cost_pico, per_token, pico_of_usd, usd_text
from gateway.observe.record import RequestRecord

MINI = PricingConfig(input=0.15, cached_input=0.075, output=0.60, batch_discount=0.5)


def at(text: str) -> float:
    """A UTC instant written ``2026-01-31T23:59:59``."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def day_of(text: str) -> int:
    return int(at(text) // DAY)


# --------------------------------------------------------------------------- cost


def test_prices_per_million_become_whole_picodollars_per_token() -> None:
    assert per_token(0.15) == 150_000
    assert per_token(0.075) == 75_000
    assert per_token(2.5) == 2_500_000
    assert per_token(0.000001) == 1  # the finest price: 1e-6 USD per million tokens


def test_cached_prompt_tokens_at_the_cached_price_the_rest_at_input() -> None:
    # 1000 prompt tokens, 800 of them cached, 200 completion tokens:
    # 200 x 0.15 + 800 x 0.075 + 200 x 0.60 per million = (30 + 60 + 120) / 1e6 USD
    cost = cost_pico(MINI, prompt=1000, cached=800, completion=200)
    assert cost == 210 * PICO_PER_USD // 1_000_000
    assert usd_text(cost) == "0.00021"
    uncached = cost_pico(MINI, prompt=1000, cached=0, completion=200)
    assert usd_text(uncached) == "0.00027"
    assert cost < uncached


def test_cached_price_defaults_to_input_and_output_to_zero() -> None:
    flat = PricingConfig(input=1.0)
    assert cost_pico(flat, 100, 60, 50) == cost_pico(flat, 100, 0, 0) == 100 * 1_000_000
    # More cached tokens than prompt tokens (a confused upstream) are capped.
    assert cost_pico(MINI, 10, 99, 0) == cost_pico(MINI, 10, 10, 0) == 10 * 75_000


def test_batch_lines_cost_the_price_less_the_discount() -> None:
    online = cost_pico(MINI, 1000, 800, 200)
    assert cost_pico(MINI, 1000, 800, 200, batch=True) * 2 == online
    odd = PricingConfig(input=0.3, output=1.1, batch_discount=0.3)
    full = cost_pico(odd, 7, 0, 3)  # 7 x 300000 + 3 x 1100000 = 5400000
    assert full == 5_400_000
    assert cost_pico(odd, 7, 0, 3, batch=True) == 3_780_000  # exactly 70 %
    free = PricingConfig(input=1.0, batch_discount=1.0)
    assert cost_pico(free, 10, 0, 0, batch=True) == 0


def test_usd_text_is_a_plain_decimal_and_budgets_are_exact() -> None:
    assert [usd_text(p) for p in (0, 1, 10**12, 15 * 10**11, 12 * 10**12)] == [
        "0",
        "0.000000000001",
        "1",
        "1.5",
        "12",
    ]
    assert pico_of_usd(0.1) == 10**11  # no binary fraction creeps in
    assert pico_of_usd(5) == 5 * PICO_PER_USD


# --------------------------------------------------------------------------- periods


def test_day_period_is_the_utc_day() -> None:
    assert bounds(at("2026-03-10T23:59:59"), "day") == (
        day_of("2026-03-10T00:00:00"),
        day_of("2026-03-11T00:00:00"),
    )


@pytest.mark.parametrize(
    ("instant", "monday"),
    [
        ("2026-01-05T00:00:00", "2026-01-05"),  # a Monday at midnight starts its week
        ("2026-01-04T23:59:59", "2025-12-29"),  # the Sunday before ends the last one
        ("2026-01-01T12:00:00", "2025-12-29"),  # a week across the new year
        ("1970-01-01T00:00:00", "1969-12-29"),  # the epoch was a Thursday
        ("2024-02-29T08:00:00", "2024-02-26"),
    ],
)
def test_weeks_start_on_monday_in_utc(instant: str, monday: str) -> None:
    start, end = bounds(at(instant), "week")
    assert start == day_of(monday + "T00:00:00")
    assert end == start + 7
    assert datetime.fromtimestamp(start * DAY, UTC).weekday() == 0


@pytest.mark.parametrize(
    ("instant", "first", "following"),
    [
        ("2026-01-31T23:59:59", "2026-01-01", "2026-02-01"),
        ("2026-02-01T00:00:00", "2026-02-01", "2026-03-01"),
        ("2025-02-28T23:59:59", "2025-02-01", "2025-03-01"),  # 28 days
        ("2024-02-29T23:59:59", "2024-02-01", "2024-03-01"),  # leap year: 29
        ("2100-02-15T00:00:00", "2100-02-01", "2100-03-01"),  # no leap day in 2100
        ("2000-02-29T00:00:00", "2000-02-01", "2000-03-01"),  # but one in 2000
        ("2026-12-31T23:59:59", "2026-12-01", "2027-01-01"),  # into the next year
        ("2026-04-30T12:00:00", "2026-04-01", "2026-05-01"),  # a 30-day month
    ],
)
def test_month_periods_end_where_the_month_ends(instant: str, first: str, following: str) -> None:
    assert bounds(at(instant), "month") == (
        day_of(first + "T00:00:00"),
        day_of(following + "T00:00:00"),
    )


# --------------------------------------------------------------------------- the store


def spender(max_usd: float, period: BudgetPeriod = "month") -> KeyLimits:
    return KeyLimits(max_budget=pico_of_usd(max_usd), budget_period=period)


def test_budget_refuses_once_spent_until_the_period_ends() -> None:
    store = MemoryStore(lease_ttl=30.0)
    limits = spender(0.001)
    now = at("2026-01-31T20:00:00")
    first = store.admit_at(Ask("k", limits, 10, "a"), now)
    assert first.allowed and first.spent == 0
    assert first.budget_resets_at == at("2026-02-01T00:00:00")
    store.settle_at(Settlement("k", limits, "a", first.day, 0, 600 * 10**6), now)
    second = store.admit_at(Ask("k", limits, 10, "b"), now + 1)  # 0.0006 of 0.001: still in
    assert second.allowed and second.spent == 600 * 10**6
    store.settle_at(Settlement("k", limits, "b", second.day, 0, 500 * 10**6), now + 2)
    refused = store.admit_at(Ask("k", limits, 10, "c"), now + 3)
    assert not refused.allowed and refused.reason == "spend"
    assert refused.spent == 1_100 * 10**6  # the last admitted request overshot
    assert refused.retry_after == pytest.approx(4 * 3600 - 3)
    # A new month starts from nothing.
    again = store.admit_at(Ask("k", limits, 10, "d"), at("2026-02-01T00:00:00"))
    assert again.allowed and again.spent == 0


def test_a_request_is_charged_to_the_period_it_ends_in() -> None:
    store = MemoryStore(lease_ttl=30.0)
    limits = spender(1.0, "day")
    before = at("2026-03-10T23:59:59")
    admitted = store.admit_at(Ask("k", limits, 1, "a"), before)
    store.settle_at(Settlement("k", limits, "a", admitted.day, 0, 7), before + 2)
    assert store.admit_at(Ask("k", limits, 1, "b"), before + 3).spent == 7


def test_keys_without_a_budget_keep_no_spend() -> None:
    store = MemoryStore(lease_ttl=30.0)
    limits = KeyLimits(rpm=100)
    store.settle_at(Settlement("k", limits, "a", "", 0, 10**12), 0.0)
    verdict = store.admit_at(Ask("k", limits, 1, "b"), 1.0)
    assert verdict.allowed and verdict.spent == 0 and verdict.budget_resets_at == 0.0


def test_key_config_budget_reaches_the_limits() -> None:
    key = KeyConfig.model_validate(
        {"name": "a", "key": "k" * 12, "max_budget": 2.5, "budget_period": "week"}
    )
    ring = KeyRing(AuthConfig(required=True, keys=(key,)))
    [client] = ring.clients()
    assert client.limited
    assert client.limits.max_budget == 2_500_000_000_000
    assert client.limits.budget_period == "week"


def test_the_refusal_names_the_budget_and_its_reset() -> None:
    store = MemoryStore(lease_ttl=30.0)
    limits = spender(5.0)
    now = at("2026-01-30T00:00:00")
    store.settle_at(Settlement("k", limits, "a", "", 0, pico_of_usd(5.25)), now)
    verdict = store.admit_at(Ask("k", limits, 1, "b"), now)
    message = budget_message(verdict, limits)
    assert "max_budget" in message and "monthly" in message
    assert "$5.25 of" in message and "$5;" in message
    assert "2026-02-01T00:00:00Z" in message and "(in 172800s)" in message


# --------------------------------------------------------------------------- the record


def test_a_record_is_billed_its_usage_or_what_a_cut_stream_generated() -> None:
    record = RequestRecord(request_id="r", requested_model="m", prompt_estimate=40)
    assert record.cost() is None  # no model with prices answered
    record.pricing = PricingConfig(input=1.0, cached_input=0.5, output=2.0)
    assert record.billed() == (0, 0, 0) and record.cost() == 0  # nothing generated
    record.streamed_tokens = 5  # cut before its usage: the estimate and the tokens so far
    assert record.billed() == (40, 0, 5)
    assert record.cost() == 40 * 1_000_000 + 5 * 2_000_000
    record.input_tokens, record.cached_tokens, record.output_tokens = 30, 16, 6
    assert record.billed() == (30, 16, 6)
    assert record.cost() == 14 * 1_000_000 + 16 * 500_000 + 6 * 2_000_000
    assert record.log_fields()["cost_usd"] == pytest.approx(3.4e-05)
    assert record.log_fields()["cached_tokens"] == 16
