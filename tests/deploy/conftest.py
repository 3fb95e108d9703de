"""The Helm runner every chart test shares (tests/deploy/chart.py)."""

from __future__ import annotations

import pytest

from tests.deploy.chart import Helm, helm_binary


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(helm_binary(), tmp_path_factory.mktemp("helm-home"))
