"""Fixtures shared by the service tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.tools.fleet import Fleets


@pytest.fixture
async def fleet_of() -> AsyncIterator[Fleets]:
    """``await fleet_of([FakeOptions(), ...], **config)``: fake replicas behind a backend."""
    fleets = Fleets()
    yield fleets
    await fleets.stop()
