"""Graceful shutdown of ``llmso serve``: a SIGTERM in the middle of a burst of streams
loses no request.

The test plays the load balancer: clients keep opening streams for a while after the
SIGTERM (the lag of a Kubernetes endpoint update, shorter than ``drain_grace``), then
stop. Every stream must complete with ``[DONE]``, including those still running when
the grace period ends and the listener closes.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.tools.engines import start_fake_upstream
from tests.tools.servers import RunningServer, gateway

pytestmark = [pytest.mark.e2e]

GRACE = 1.5
LB_LAG = 0.9  # the load balancer keeps sending this long after the SIGTERM


@pytest.fixture
def server() -> Iterator[RunningServer]:
    # Streams of at least 1.5 s (60 chunks, 25 ms apart), longer on a loaded machine.
    with start_fake_upstream("--chunks", "60", "--delay-ms", "25") as fake:
        config = {
            "server": {"drain_grace": GRACE, "drain_timeout": 20},
            "models": [
                {
                    "name": "m",
                    "backend": "openai",
                    "base_url": fake.url + "/v1",
                    "upstream_model": "fake-model",
                    "health_interval": 0.5,
                }
            ],
        }
        with gateway(config) as running:
            yield running


def test_sigterm_during_a_stream_burst_loses_nothing(server: RunningServer) -> None:
    outcomes: list[tuple[str, float]] = []
    sending = threading.Event()
    sending.set()
    lock = threading.Lock()

    def worker(delay: float) -> None:
        time.sleep(delay)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            while sending.is_set():
                outcome = "lost"
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
                try:
                    with client.stream(
                        "POST", "/v1/chat/completions", json={**body, "stream": True}
                    ) as r:
                        text = "".join(r.iter_text())
                        if r.status_code == 200 and text.rstrip().endswith("data: [DONE]"):
                            outcome = "ok"
                        else:
                            outcome = f"{r.status_code}"
                except httpx.HTTPError as exc:
                    outcome = f"lost: {exc!r}"
                with lock:
                    outcomes.append((outcome, time.monotonic()))

    # Staggered clients, so streams start at every phase; the last one arrives during the
    # load balancer's lag (0.5 s after the SIGTERM), so its stream of >= 1.5 s is still
    # running when the grace period ends and the listener closes, on any machine.
    delays = [0.15 * i for i in range(7)] + [2.0]
    threads = [threading.Thread(target=worker, args=(d,)) for d in delays]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    sigterm_at = time.monotonic()
    os.kill(server.process.pid, signal.SIGTERM)
    try:
        time.sleep(0.2)
        ready = httpx.get(server.url + "/ready", timeout=5)
        assert ready.status_code == 503 and ready.json()["status"] == "draining"
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        time.sleep(LB_LAG - 0.2)
    finally:
        sending.clear()
    for thread in threads:
        thread.join(30)
    server.process.wait(30)  # it exits on its own once the streams are done
    failed = [o for o, _ in outcomes if o != "ok"]
    assert not failed, failed
    after = [t for _, t in outcomes if t > sigterm_at + GRACE + 0.2]
    assert after, (
        "no stream was still running when the listener closed",
        [round(t - sigterm_at, 2) for _, t in outcomes],
    )
    assert len(outcomes) >= len(delays)
