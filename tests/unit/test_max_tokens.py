"""``effective_max_tokens``: the one rule every backend applies to ``max_tokens``."""

from __future__ import annotations

from backends.base import effective_max_tokens


def test_the_clients_limit_wins() -> None:
    assert effective_max_tokens(7, 50, 100) == 7
    assert effective_max_tokens(700, 50, 100) == 700  # the backend refuses it, not this


def test_the_models_default_is_capped_by_the_room_left() -> None:
    assert effective_max_tokens(None, 50, 100) == 50
    assert effective_max_tokens(None, 50, 20) == 20
    assert effective_max_tokens(None, 50, None) == 50  # a proxy cannot count the prompt


def test_no_limit_anywhere_means_the_room_left_or_none() -> None:
    assert effective_max_tokens(None, None, 100) == 100  # OpenAI's meaning
    assert effective_max_tokens(None, None, None) is None  # the upstream's own default
