"""``llmso serve`` with ``server.workers: 2``: real supervisor and worker processes in
front of the fake upstream (issue 41).

- both workers serve (each names itself in ``x-llmso-worker``; ``/admin/models`` lists
  two pids), and one ``/metrics`` counts every request once;
- a key's rpm holds exactly across both workers, with the supervisor's own store and
  with Redis; a Responses conversation continues on whichever worker gets the follow-up;
- a batch runs each of its lines once though both workers poll the batch state;
- SIGTERM to the whole process group drains the streams in flight on both workers;
- a config edit reaches both workers; an admin unload reaches both workers;
- past ``server.max_in_flight`` both workers shed with ``Retry-After``, in OpenAI's
  envelope and in Anthropic's.

Requests are sent with ``Connection: close``, so each opens a new connection and the
kernel's ``SO_REUSEPORT`` hash spreads them over the workers.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
import yaml

from tests.tools.engines import start_fake_upstream
from tests.tools.frontdoor_app import metric
from tests.tools.redis_server import redis_missing, redis_server
from tests.tools.servers import RunningServer, gateway, serve_file, stop_process

pytestmark = [pytest.mark.e2e]

ADMIN = "admin-" + uuid.uuid4().hex
OPEN_KEY = "sk-open-" + uuid.uuid4().hex
TIGHT_KEY = "sk-tight-" + uuid.uuid4().hex
RPM = 10
CLOSE = {"connection": "close"}


@pytest.fixture(scope="module")
def upstream() -> Iterator[RunningServer]:
    with start_fake_upstream("--chunks", "8") as fake:
        yield fake


def fleet_config(upstream: RunningServer, **server: Any) -> dict[str, Any]:
    return {
        "server": {"workers": 2, **server},
        "auth": {
            "required": True,
            "keys": [
                {"name": "open", "key": OPEN_KEY},
                {"name": "tight", "key": TIGHT_KEY, "rpm": RPM},
            ],
        },
        "models": [
            {
                "name": "m",
                "backend": "openai",
                "base_url": upstream.url + "/v1",
                "upstream_model": "fake-model",
                "health_interval": 0.5,
            }
        ],
    }


def _env() -> dict[str, str]:
    return {"LLMSO_ADMIN_KEY": ADMIN}


def chat(url: str, key: str = OPEN_KEY, model: str = "m", **fields: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], **fields}
    headers = {"authorization": f"Bearer {key}", **CLOSE}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=headers, timeout=30)


def burst(url: str, count: int, **fields: Any) -> list[httpx.Response]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda _: chat(url, **fields), range(count)))


def admin_get(url: str, path: str) -> Any:
    response = httpx.get(url + path, headers={"authorization": f"Bearer {ADMIN}"}, timeout=30)
    response.raise_for_status()
    return response.json()


def workers_of(responses: list[httpx.Response]) -> Counter[str]:
    return Counter(r.headers.get("x-llmso-worker", "?") for r in responses)


@pytest.fixture(scope="module")
def fleet(upstream: RunningServer) -> Iterator[RunningServer]:
    with tempfile.TemporaryDirectory(prefix="llmso-fleet-batch-") as batches:
        config = fleet_config(upstream)
        config["batch"] = {"directory": batches, "poll_interval": 0.2}
        with gateway(config, env=_env()) as running:
            yield running


# --------------------------------------------------------------------------- serving


def test_both_workers_serve_and_one_metrics_counts_every_request_once(
    fleet: RunningServer,
) -> None:
    before = metric(httpx.get(fleet.url + "/metrics").text, "llmso_key_requests_total", key="open")
    admin_get(fleet.url, "/admin/stats")  # each worker's baseline of the overhead mean
    answers = burst(fleet.url, 40)
    assert [r.status_code for r in answers] == [200] * 40
    served = workers_of(answers)
    assert set(served) == {"0", "1"}, served
    workers = admin_get(fleet.url, "/admin/models")["workers"]
    assert [w["worker"] for w in workers] == [0, 1]
    assert len({w["pid"] for w in workers}) == 2
    assert fleet.process.pid not in {w["pid"] for w in workers}  # the supervisor serves none

    text = httpx.get(fleet.url + "/metrics").text
    assert metric(text, "llmso_fleet_workers") == 2
    assert metric(text, "llmso_key_requests_total", key="open") - before == 40
    # One console: the window's figures and the overhead mean come from both workers.
    stats = admin_get(fleet.url, "/admin/stats")
    assert stats["workers"] == 2
    assert 0 <= stats["loop_lag_s"] < 1.0  # the worse of the two workers' loops
    figures = stats["models"]["m"]
    assert figures["requests"] >= 40 and figures["state"] == "ready"
    assert 0 < figures["overhead_mean_s"] < 1.0
    # The first test on this fleet: the 40 requests are all the recent ones, though no
    # worker served all of them.
    recent = admin_get(fleet.url, "/admin/requests?limit=100")["requests"]
    assert len(recent) == 40 > max(served.values())
    usage = admin_get(fleet.url, "/admin/usage")
    open_key = next(k for k in usage["keys"] if k["name"] == "open")
    assert open_key["requests"]["ok"] >= 40 and usage["store"]["kind"] == "fleet"


def test_a_keys_rpm_holds_exactly_across_workers(fleet: RunningServer) -> None:
    answers = burst(fleet.url, 16, key=TIGHT_KEY)
    statuses = Counter(r.status_code for r in answers)
    assert statuses == {200: RPM, 429: 16 - RPM}, statuses
    assert set(workers_of(answers)) == {"0", "1"}
    assert all("retry-after" in r.headers for r in answers if r.status_code == 429)


def test_a_responses_conversation_continues_on_any_worker(fleet: RunningServer) -> None:
    headers = {"authorization": f"Bearer {OPEN_KEY}", **CLOSE}
    first = httpx.post(
        fleet.url + "/v1/responses", json={"model": "m", "input": "hi"}, headers=headers
    )
    assert first.status_code == 200, first.text
    seen = {first.headers["x-llmso-worker"]}
    for _ in range(12):  # follow-ups on new connections land on both workers
        follow = httpx.post(
            fleet.url + "/v1/responses",
            json={"model": "m", "input": "more", "previous_response_id": first.json()["id"]},
            headers=headers,
        )
        assert follow.status_code == 200, follow.text
        seen.add(follow.headers["x-llmso-worker"])
    assert seen == {"0", "1"}


def test_a_batch_runs_each_line_once_though_both_workers_poll(
    fleet: RunningServer, upstream: RunningServer
) -> None:
    client = openai.OpenAI(base_url=fleet.url + "/v1", api_key=OPEN_KEY, max_retries=0)
    lines = 12
    data = b"".join(
        orjson.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            }
        )
        + b"\n"
        for i in range(lines)
    )
    done_before = _upstream_completed(upstream)
    file = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while batch.status not in ("completed", "failed") and time.monotonic() < deadline:
        time.sleep(0.2)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts is not None and batch.request_counts.completed == lines
    output = client.files.content(batch.output_file_id or "").content.splitlines()
    assert sorted(orjson.loads(line)["custom_id"] for line in output) == sorted(
        f"line-{i}" for i in range(lines)
    )
    assert _upstream_completed(upstream) - done_before == lines  # none ran twice


def _upstream_completed(upstream: RunningServer) -> int:
    text = httpx.get(upstream.url + "/metrics").text
    return int(metric(text, "fake_completed"))


def test_an_admin_unload_reaches_every_worker(fleet: RunningServer) -> None:
    def loads() -> float:
        text = httpx.get(fleet.url + "/metrics").text
        return metric(text, "llmso_model_loads_total", model="m", result="success")

    before = loads()
    headers = {"authorization": f"Bearer {ADMIN}"}
    unloaded = httpx.post(fleet.url + "/admin/models/m/unload", headers=headers, timeout=30)
    assert unloaded.status_code == 200, unloaded.text
    assert unloaded.json()["state"] == "unloaded" and "fleet_failures" not in unloaded.json()
    # Each worker had unloaded it: each loads it again on its first request.
    answers = burst(fleet.url, 16)
    assert {r.status_code for r in answers} == {200}
    assert set(workers_of(answers)) == {"0", "1"}
    assert loads() - before == 2


def test_a_killed_worker_is_replaced_and_catches_up(upstream: RunningServer) -> None:
    with gateway(fleet_config(upstream), env=_env()) as running:

        def loads() -> float:
            text = httpx.get(running.url + "/metrics").text
            return metric(text, "llmso_model_loads_total", model="m", result="success")

        headers = {"authorization": f"Bearer {ADMIN}"}
        assert httpx.post(running.url + "/admin/models/m/unload", headers=headers).is_success
        victim = next(
            w for w in admin_get(running.url, "/admin/models")["workers"] if w["worker"] == 1
        )
        os.kill(victim["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        workers: list[dict[str, int]] = []
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                workers = admin_get(running.url, "/admin/models")["workers"]
                if len(workers) == 2 and victim["pid"] not in {w["pid"] for w in workers}:
                    break
            time.sleep(0.25)
        assert [w["worker"] for w in workers] == [0, 1]
        assert victim["pid"] not in {w["pid"] for w in workers}
        # Worker 0's one load, the replacement's preload; the replacement replayed the
        # unload, so each worker loads the model again on its first request: two more.
        assert loads() == 2
        answers = burst(running.url, 16)
        assert {r.status_code for r in answers} == {200}
        assert set(workers_of(answers)) == {"0", "1"}
        assert loads() == 4


# --------------------------------------------------------------------------- Redis


def test_limits_hold_exactly_across_workers_with_redis(upstream: RunningServer) -> None:
    missing = redis_missing()
    if missing:
        pytest.skip(missing)
    with redis_server() as redis:
        config = fleet_config(upstream)
        config["limits"] = {"store": redis.url}
        with gateway(config, env=_env()) as running:
            answers = burst(running.url, 16, key=TIGHT_KEY)
            statuses = Counter(r.status_code for r in answers)
            assert statuses == {200: RPM, 429: 16 - RPM}, statuses
            assert set(workers_of(answers)) == {"0", "1"}
            assert admin_get(running.url, "/admin/usage")["store"]["kind"] == "redis"


# --------------------------------------------------------------------------- reload


def test_a_config_edit_reaches_both_workers(upstream: RunningServer, tmp_path: Path) -> None:
    config = fleet_config(upstream)
    path = tmp_path / "llmso.yaml"
    path.write_text(yaml.safe_dump(config))
    running = serve_file(path, {"LLMSO_WATCH_CONFIG": "true", **_env()})
    try:
        assert {r.status_code for r in burst(running.url, 4, model="renamed")} == {404}
        config["models"][0]["aliases"] = ["renamed"]
        path.write_text(yaml.safe_dump(config))
        deadline = time.monotonic() + 30
        while True:
            answers = burst(running.url, 16, model="renamed")
            if {r.status_code for r in answers} == {200} or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert {r.status_code for r in answers} == {200}
        assert set(workers_of(answers)) == {"0", "1"}
    finally:
        stop_process(running)


# --------------------------------------------------------------------------- shedding


def test_both_workers_shed_past_their_ceiling_in_each_envelope() -> None:
    with start_fake_upstream("--chunks", "80", "--delay-ms", "50") as slow:
        config = fleet_config(slow, max_in_flight=1)
        with gateway(config, env=_env()) as running, contextlib.ExitStack() as streams:
            held: dict[str, httpx.Response] = {}
            shed = 0
            for _ in range(60):  # new connections until each worker holds one stream
                client = streams.enter_context(httpx.Client(timeout=30))
                response = streams.enter_context(
                    client.stream(
                        "POST",
                        running.url + "/v1/chat/completions",
                        json={
                            "model": "m",
                            "stream": True,
                            "messages": [{"role": "user", "content": "x"}],
                        },
                        headers={"authorization": f"Bearer {OPEN_KEY}"},
                    )
                )
                if response.status_code == 503:
                    shed += 1
                    continue
                held[response.headers["x-llmso-worker"]] = response
                if len(held) == 2:
                    break
            assert set(held) == {"0", "1"}
            openai_shed = chat(running.url)
            assert openai_shed.status_code == 503
            assert openai_shed.headers["retry-after"] == "1"
            assert openai_shed.json()["error"]["code"] == "gateway_saturated"
            anthropic_shed = httpx.post(
                running.url + "/v1/messages",
                json={
                    "model": "m",
                    "max_tokens": 8,
                    "messages": [{"role": "user", "content": "x"}],
                },
                headers={"x-api-key": OPEN_KEY, **CLOSE},
            )
            assert anthropic_shed.status_code == 503
            assert anthropic_shed.headers["retry-after"] == "1"
            assert anthropic_shed.json()["error"]["type"] == "overloaded_error"
            for response in held.values():  # the admitted streams run to their end
                text = "".join(response.iter_text())
                assert text.rstrip().endswith("data: [DONE]")
            total = metric(httpx.get(running.url + "/metrics").text, "llmso_shed_requests_total")
            assert total == shed + 2


# --------------------------------------------------------------------------- drain


def test_sigterm_to_the_group_drains_streams_on_both_workers() -> None:
    with start_fake_upstream("--chunks", "60", "--delay-ms", "25") as slow:
        config = fleet_config(slow, drain_grace=1.0, drain_timeout=20)
        with gateway(config, env=_env()) as running:
            outcomes: list[tuple[str, str]] = []
            lock = threading.Lock()

            def stream() -> None:
                body = {
                    "model": "m",
                    "stream": True,
                    "messages": [{"role": "user", "content": "x"}],
                }
                headers = {"authorization": f"Bearer {OPEN_KEY}", **CLOSE}
                outcome, worker = "lost", "?"
                try:
                    with httpx.stream(
                        "POST",
                        running.url + "/v1/chat/completions",
                        json=body,
                        headers=headers,
                        timeout=30,
                    ) as r:
                        worker = r.headers.get("x-llmso-worker", "?")
                        text = "".join(r.iter_text())
                        ok = r.status_code == 200 and text.rstrip().endswith("data: [DONE]")
                        outcome = "ok" if ok else str(r.status_code)
                except httpx.HTTPError as exc:
                    outcome = f"lost: {exc!r}"
                with lock:
                    outcomes.append((outcome, worker))

            threads = [threading.Thread(target=stream) for _ in range(12)]
            for thread in threads:
                thread.start()
            time.sleep(0.8)  # every stream (>= 1.5 s) is running
            os.killpg(running.process.pid, signal.SIGTERM)
            for thread in threads:
                thread.join(40)
            assert running.process.wait(40) == 0
            assert [o for o, _ in outcomes if o != "ok"] == []
            assert {w for _, w in outcomes} == {"0", "1"}
