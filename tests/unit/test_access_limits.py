"""The limiter arithmetic: GCRA windows, refunds and debts, leases, the UTC-day budget,
and all-or-nothing admission, on the in-process store with an explicit clock."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from config.frontdoor import KeyConfig, hash_key
from config.loader import ConfigError, load_config
from gateway.access.limits import (
    Ask,
    KeyLimits,
    MemoryStore,
    Settlement,
    gcra_adjust,
    gcra_take,
    gcra_window,
    seconds_to_midnight,
    utc_day,
)

T0 = 1_800_000_000.0  # a fixed instant, 08:00 UTC


def store() -> MemoryStore:
    return MemoryStore(lease_ttl=30.0)


def ask(limits: KeyLimits, cost: int = 1, lease: str = "l") -> Ask:
    return Ask("k", limits, cost, lease)


def test_gcra_burst_is_the_limit_then_refills_continuously() -> None:
    tat, taken = 0.0, 0
    for _ in range(25):
        fits, new, _ = gcra_take(tat, T0, 10, 1)
        if fits:
            tat, taken = new, taken + 1
    assert taken == 10
    fits, _, wait = gcra_take(tat, T0, 10, 1)
    assert not fits
    assert wait == pytest.approx(6.0)  # one request's worth: 60 s / 10
    assert gcra_take(tat, T0 + 6.0, 10, 1)[0]
    assert gcra_window(tat, T0, 10).remaining == 0
    assert gcra_window(tat, T0 + 30.0, 10).remaining == 5
    assert gcra_window(tat, T0 + 30.0, 10).reset == pytest.approx(30.0)
    assert gcra_window(tat, T0 + 61.0, 10).remaining == 10


def test_gcra_cost_larger_than_the_limit_never_fits() -> None:
    fits, _, wait = gcra_take(0.0, T0, 100, 101)
    assert not fits and math.isinf(wait)


def test_refund_gives_back_but_never_more_than_the_window() -> None:
    _, tat, _ = gcra_take(0.0, T0, 600, 500)
    assert gcra_window(tat, T0, 600).remaining == 100
    refunded = gcra_adjust(tat, T0, 600, -400)
    assert gcra_window(refunded, T0, 600).remaining == 500
    assert gcra_adjust(tat, T0, 600, -10_000) == T0  # no credit beyond a full window
    debt = gcra_adjust(tat, T0, 600, +300)  # used more than reserved
    assert gcra_window(debt, T0, 600).remaining == 0
    assert not gcra_take(debt, T0, 600, 1)[0]


async def test_admission_is_all_or_nothing() -> None:
    memory = store()
    limits = KeyLimits(rpm=5, tpm=100)
    assert memory.admit_at(ask(limits, 60), T0).allowed
    refused = memory.admit_at(ask(limits, 60), T0)
    assert not refused.allowed and refused.reason == "tpm"
    # The refused request took no request allowance.
    assert refused.requests is not None and refused.requests.remaining == 4
    assert refused.tokens is not None and refused.tokens.remaining == 40
    big = memory.admit_at(ask(limits, 101), T0)
    assert big.reason == "too_large"


async def test_settle_refunds_the_unused_reservation() -> None:
    memory = store()
    limits = KeyLimits(tpm=1000, tokens_per_day=10_000)
    verdict = memory.admit_at(ask(limits, 800), T0)
    assert verdict.tokens is not None and verdict.tokens.remaining == 200
    memory.settle_at(Settlement("k", limits, "l", verdict.day, 50 - 800), T0)
    after = memory.admit_at(ask(limits, 900), T0)
    assert after.allowed  # 950 in use after the refund, not 1700
    assert after.day_used == 950


async def test_parallel_leases_release_and_expire() -> None:
    memory = store()
    limits = KeyLimits(max_parallel=2)
    assert memory.admit_at(ask(limits, lease="a"), T0).allowed
    assert memory.admit_at(ask(limits, lease="b"), T0).allowed
    assert memory.admit_at(ask(limits, lease="c"), T0).reason == "parallel"
    memory.settle_at(Settlement("k", limits, "a", utc_day(T0), 0), T0)
    assert memory.admit_at(ask(limits, lease="c"), T0).allowed
    # A lease whose release was lost frees its slot after lease_ttl.
    assert memory.admit_at(ask(limits, lease="d"), T0 + 31.0).inflight == 1


async def test_daily_budget_resets_at_midnight_utc() -> None:
    memory = store()
    limits = KeyLimits(tokens_per_day=1000)
    late = T0 + seconds_to_midnight(T0) - 1.0  # 23:59:59 UTC
    assert memory.admit_at(ask(limits, 1000), late).allowed
    refused = memory.admit_at(ask(limits, 1), late)
    assert refused.reason == "budget"
    assert refused.retry_after == pytest.approx(1.0)
    next_day = memory.admit_at(ask(limits, 1), late + 2.0)
    assert next_day.allowed and next_day.day_used == 1
    assert utc_day(late) != utc_day(late + 2.0)


def test_plain_keys_are_hashed_at_load_and_never_kept() -> None:
    key = KeyConfig.model_validate({"name": "team-a", "key": "sk-test-123456"})
    assert key.key_sha256 == hash_key("sk-test-123456")
    assert "sk-test-123456" not in repr(key) + key.model_dump_json()
    with pytest.raises(ValueError, match="not set"):
        KeyConfig.model_validate({"name": "a", "key": "${NOT_SET_ANYWHERE}"})


def test_bad_auth_config_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "models:\n  - {name: a, backend: openai, base_url: http://u}\n"
        "auth:\n  keys:\n    - {name: x, key: sk-0123456789, key_sha256: " + "0" * 64 + "}\n"
    )
    with pytest.raises(ConfigError, match=r"auth\.keys\.0.*not both"):
        load_config(path)
    path.write_text(
        "models:\n  - {name: a, backend: openai, base_url: http://u}\nlimits: {store: mysql://x}\n"
    )
    with pytest.raises(ConfigError, match=r"limits\.store"):
        load_config(path)


def test_a_keys_priority_range_and_weight() -> None:
    def key(**fields: object) -> KeyConfig:
        return KeyConfig.model_validate({"name": "k", "key": "sk-test-123456", **fields})

    assert key().allowed_priorities == (0, 0) and key().weight == 1.0
    assert key(priority="low").allowed_priorities == (1, 1)  # only its own level
    assert key(priority_range=["high", "low"]).allowed_priorities == (-1, 1)  # named levels
    assert key(priority="high", priority_range=[-3, 2]).allowed_priorities == (-3, 2)
    for bad, match in (
        ({"priority_range": [1, -1]}, "first not above the second"),
        ({"priority_range": [-11, 0]}, "within"),
        ({"priority_range": ["urgent", 0]}, "priority_range"),
        ({"priority_range": [-1]}, "priority_range"),
        ({"priority": "low", "priority_range": [-1, 0]}, "own priority"),
        ({"weight": 0}, "weight"),
        ({"weight": 1001}, "weight"),
    ):
        with pytest.raises(ValueError, match=match):
            key(**bad)
