"""Read an engine's load from its Prometheus ``/metrics`` page.

Only a handful of gauges matter for routing, so this reads lines by name instead of
parsing every family (a vLLM page is mostly histograms): samples of the same name are
summed over their labels (one per model or engine core), KV usage takes the largest.

Engines: vLLM (``vllm:num_requests_waiting``/``running``, ``kv_cache_usage_perc``, older
``gpu_cache_usage_perc``); Triton (``nv_inference_pending_request_count`` per model, and
TensorRT-LLM's ``nv_trt_llm_request_metrics{request_type=active|scheduled|...}``: running
is ``scheduled``, waiting is ``active - scheduled``). A Triton server serves many models,
so with ``model`` given, samples labelled with another ``model="..."`` are skipped; the
TensorRT-LLM engine is usually a model of its own under an ensemble (``tensorrt_llm``), so
its request metrics count whatever model they carry. Pure parsing here; the fetch (with
its timeout) is ``scrape_load``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import aiohttp

_WAITING = frozenset({"vllm:num_requests_waiting", "nv_inference_pending_request_count"})
_RUNNING = frozenset({"vllm:num_requests_running"})
# vLLM renamed gpu_cache_usage_perc to kv_cache_usage_perc; both are 0..1 fractions.
_KV = frozenset({"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"})
_TRT_REQUESTS = "nv_trt_llm_request_metrics"
_PER_MODEL = frozenset({"nv_inference_pending_request_count"})
_MAX_PAGE = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class EngineLoad:
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    seen: bool = False
    """Whether the page had any of the gauges (an engine without them reads as idle)."""


def parse_load(text: str, model: str | None = None) -> EngineLoad:
    """The routing gauges of one page; ``model`` filters Triton's per-model samples."""
    waiting = running = kv = 0.0
    trt_active = trt_scheduled = 0.0
    seen = False
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        space = line.find(" ")
        end = brace if 0 <= brace < space or (brace >= 0 and space < 0) else space
        if end <= 0:
            continue
        name = line[:end]
        known = name in _WAITING or name in _RUNNING or name in _KV
        if not known and name != _TRT_REQUESTS:
            continue
        labels = line[brace : line.rfind("}") + 1] if end == brace else ""
        if model is not None and name in _PER_MODEL and not _same_model(labels, model):
            continue
        value = _value(line, brace if end == brace else -1)
        if value is None:
            continue
        if name == _TRT_REQUESTS:
            if 'request_type="active"' in labels:
                trt_active += value
            elif 'request_type="scheduled"' in labels:
                trt_scheduled += value
            else:
                continue
        elif name in _WAITING:
            waiting += value
        elif name in _RUNNING:
            running += value
        else:
            kv = max(kv, value)
        seen = True
    running += trt_scheduled
    waiting += max(trt_active - trt_scheduled, 0.0)
    return EngineLoad(waiting, running, min(kv, 1.0), seen)


def _same_model(labels: str, model: str) -> bool:
    """Whether a sample's ``model`` label is ``model`` (a sample without one counts)."""
    start = labels.find('model="')
    if start < 0:
        return True
    start += len('model="')
    return labels[start : labels.find('"', start)] == model


def _value(line: str, brace: int) -> float | None:
    rest = line[line.rfind("}") + 1 :] if brace >= 0 else line[line.find(" ") :]
    fields = rest.split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


class NoMetrics(Exception):
    """The replica has no ``/metrics`` page (404): stop asking it."""


async def scrape_load(
    session: aiohttp.ClientSession, url: str, seconds: float, model: str | None = None
) -> EngineLoad:
    """GET ``url`` within ``seconds``. Raises ``NoMetrics`` on a 404; any other
    failure raises the client's exception (the caller keeps the last reading)."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=seconds)) as response:
        if response.status == 404:
            raise NoMetrics(url)
        response.raise_for_status()
        raw = await response.content.read(_MAX_PAGE)
    return parse_load(raw.decode("utf-8", "replace"), model)
