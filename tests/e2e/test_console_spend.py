"""End to end: the console's client keys table in a real browser (Debian's Chromium,
Playwright) against ``llmso serve`` with a priced model relayed to the fake upstream and
two keys, one with a budget: each key's spend and budget show, and follow new requests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_console_browser import CHROMIUM, CHROMIUM_ARGS, SHOTS, PageErrors, _skip_reason
from tests.tools.engines import proxy_config, start_fake_upstream
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "priced-proxy"
ADMIN_KEY = "console-spend-admin"
KEY_A = "sk-console-a-" + uuid.uuid4().hex
KEY_B = "sk-console-b-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with start_fake_upstream("--chunks", "4", "--model", "up-model") as upstream:
        # 2 completion tokens x 1000 USD per million: 0.002 USD an answer.
        pricing = {"input": 0.0, "output": 1000.0}
        config = proxy_config(MODEL, upstream, "generic", "up-model", pricing=pricing)
        config["auth"] = {
            "required": True,
            "keys": [
                {"name": "team-a", "key": "${CONSOLE_KEY_A}", "max_budget": 0.01},
                {"name": "team-b", "key": "${CONSOLE_KEY_B}"},
            ],
        }
        env = {"LLMSO_ADMIN_KEY": ADMIN_KEY, "CONSOLE_KEY_A": KEY_A, "CONSOLE_KEY_B": KEY_B}
        with gateway(config, env=env) as running:
            yield running


@pytest.fixture(scope="module")
def browser(server: RunningServer) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


def _ask(server: RunningServer, key: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    response = httpx.post(
        server.url + "/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200 and response.headers["x-llmso-cost"] == "0.002"


def test_the_console_shows_each_keys_spend_and_budget(server: RunningServer, browser: Any) -> None:
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors = PageErrors(page)
    page.goto(server.url + "/ui/")
    page.fill("#admin-key", ADMIN_KEY)
    page.click("#key-form button[type=submit]")
    row_a = page.locator('#keys tr[data-key="team-a"]')
    row_b = page.locator('#keys tr[data-key="team-b"]')
    expect(row_a).to_contain_text("$0 of $0.01 this month", timeout=10_000)
    expect(row_b.locator("td").nth(4)).to_have_text("none")

    for _ in range(2):
        _ask(server, KEY_A)
    _ask(server, KEY_B)
    expect(row_a.locator("td.spend")).to_have_text("$0.0040", timeout=10_000)
    expect(row_a).to_contain_text("$0.0040 of $0.01 this month")
    assert row_a.locator("progress").evaluate("p => [p.value, p.max]") == [0.004, 0.01]
    expect(row_b.locator("td.spend")).to_have_text("$0.0020")
    expect(row_a.locator("td").nth(1)).to_have_text("2")  # requests
    page.screenshot(path=str(SHOTS / "keys-light.png"), full_page=True)
    assert errors.errors == []
