"""Fixtures shared by the service tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.tools.fleet import Fleets
from tests.tools.frontdoor_app import AppFactory, app_factory


@pytest.fixture
async def fleet_of() -> AsyncIterator[Fleets]:
    """``await fleet_of([FakeOptions(), ...], **config)``: fake replicas behind a backend."""
    fleets = Fleets()
    yield fleets
    await fleets.stop()


@pytest.fixture
async def make_app() -> AsyncIterator[AppFactory]:
    """``await make_app(config)``: a gateway app on fake backends (``frontdoor_app``),
    closed at the end of the test."""
    async with app_factory() as make:
        yield make
