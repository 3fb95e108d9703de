"""``Mirrors`` with a scripted shadow: copies run in their own tasks, bounded per model
(extra copies dropped and counted), failures and bugs contained, cancelled on stop, and
each copy's record marked with the primary's id."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest
from prometheus_client import CollectorRegistry

from backends.base import ChatMessage, GenerationRequest, RequestKind, SamplingParams, Usage
from backends.errors import NotReady
from gateway.observe.logs import REQUEST_LOGGER
from gateway.observe.record import RequestRecord
from gateway.service.mirror import Copy, MirrorMetrics, Mirrors


def request(request_id: str) -> GenerationRequest:
    return GenerationRequest(
        request_id=request_id,
        model="shadow",
        kind=RequestKind.CHAT,
        sampling=SamplingParams(max_tokens=4),
        messages=(ChatMessage(role="user", content="hi"),),
    )


def copy_of(primary: str, limit: int = 2) -> Copy:
    return Copy("main", "shadow", request(f"{primary}-mirror"), primary, limit, "/v1/chat")


class Shadow:
    """Scripted sends: each waits for ``release``; ``fail`` raises, ``bug`` has a bug."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.records: list[RequestRecord] = []
        self.fail = False
        self.bug = False

    async def __call__(self, name: str, req: GenerationRequest, record: RequestRecord) -> None:
        self.records.append(record)
        await self.release.wait()
        if self.fail:
            raise NotReady("shadow is down")
        if self.bug:
            raise ZeroDivisionError("shadow bug")
        record.observe(Usage(prompt_tokens=3, completion_tokens=5))


def outcomes(prometheus: CollectorRegistry) -> dict[str, float]:
    found = {}
    for outcome in ("ok", "error", "dropped", "cancelled"):
        labels = {"model": "main", "shadow": "shadow", "outcome": outcome}
        found[outcome] = prometheus.get_sample_value("llmso_mirror_requests_total", labels) or 0.0
    return found


async def settle(mirrors: Mirrors) -> None:
    for _ in range(50):
        if mirrors.inflight("main") == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("copies still running")


async def test_copies_are_bounded_per_model_and_extra_ones_dropped() -> None:
    prometheus = CollectorRegistry()
    shadow = Shadow()
    mirrors = Mirrors(shadow, MirrorMetrics(prometheus))
    accepted = [mirrors.offer(copy_of(f"p{i}")) for i in range(5)]
    assert accepted == [True, True, False, False, False]
    assert mirrors.inflight("main") == 2
    shadow.release.set()
    await settle(mirrors)
    assert outcomes(prometheus) == {"ok": 2, "error": 0, "dropped": 3, "cancelled": 0}
    tokens = prometheus.get_sample_value(
        "llmso_mirror_generation_tokens_total", {"model": "main", "shadow": "shadow"}
    )
    assert tokens == 10
    assert mirrors.offer(copy_of("later"))  # room again once they ended
    await settle(mirrors)


async def test_a_failing_or_buggy_shadow_is_counted_and_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    prometheus = CollectorRegistry()
    shadow = Shadow()
    mirrors = Mirrors(shadow, MirrorMetrics(prometheus))
    shadow.fail = True
    shadow.release.set()
    mirrors.offer(copy_of("p1"))
    await settle(mirrors)
    shadow.fail, shadow.bug = False, True
    with caplog.at_level(logging.ERROR, "gateway.service.mirror"):
        mirrors.offer(copy_of("p2"))
        await settle(mirrors)
    assert outcomes(prometheus)["error"] == 2
    assert [r.error_type for r in shadow.records] == ["service_unavailable", "server_error"]
    assert "mirror p2-mirror to shadow failed" in caplog.text


async def test_stop_cancels_copies_in_flight_and_refuses_new_ones() -> None:
    prometheus = CollectorRegistry()
    shadow = Shadow()
    mirrors = Mirrors(shadow, MirrorMetrics(prometheus))
    mirrors.offer(copy_of("p1"))
    await asyncio.sleep(0)
    await mirrors.stop()
    assert mirrors.inflight("main") == 0
    assert not mirrors.offer(copy_of("p2"))
    assert outcomes(prometheus) == {"ok": 0, "error": 0, "dropped": 1, "cancelled": 1}
    assert shadow.records[0].status == "cancelled"


async def test_the_copy_logs_one_line_marked_with_the_primary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shadow = Shadow()
    shadow.release.set()
    mirrors = Mirrors(shadow, MirrorMetrics(CollectorRegistry()))
    with caplog.at_level(logging.INFO, REQUEST_LOGGER):
        mirrors.offer(copy_of("primary-1"))
        await settle(mirrors)
    lines = [orjson.loads(r.getMessage()) for r in caplog.records if r.name == REQUEST_LOGGER]
    assert len(lines) == 1
    line = lines[0]
    assert (line["request_id"], line["mirror_of"]) == ("primary-1-mirror", "primary-1")
    assert (line["status"], line["input_tokens"], line["output_tokens"]) == ("ok", 3, 5)
    assert shadow.records[0].endpoint_label == "mirror:/v1/chat"
