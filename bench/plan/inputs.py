"""What ``llmso plan`` reads: measured curves, a traffic profile, cold starts.

- A **curve** is one system's closed-loop levels from ``llmso bench`` result files
  (``results.json``): per concurrency level the throughput and every measured request's
  TTFT, E2E, prompt and output tokens and inter-chunk gaps, kept as samples (the engine
  model in ``bench.plan.simulator`` is fitted to them).
- The **profile** (YAML) says, per model, which measured system serves it, its request
  rate (one Poisson rate or 24 hourly rates), its tokens, the SLOs and the prices.
- **Cold starts** come from a Prometheus scrape of the gateway (``llmso_model_load_seconds``
  sum and count per model) or from the profile (``cold_start_s``, then named as such).

Everything here is parsed once into frozen dataclasses; nothing below reads raw JSON.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


@dataclass(frozen=True, slots=True)
class Level:
    """One measured closed-loop level of one system."""

    concurrency: int
    requests_per_s: float
    output_tokens_per_s: float
    ttft_s: tuple[float, ...]  # successful measured requests, paired with e2e_s
    e2e_s: tuple[float, ...]
    output_tokens: float  # mean per request
    prompt_tokens: float  # mean per request
    source: str  # "file#system@c=N"
    prompt_tokens_s: tuple[int, ...] = ()  # per request, paired with ttft_s (0: unknown)
    output_tokens_s: tuple[int, ...] = ()  # per request, paired with ttft_s
    itl_s: tuple[float, ...] = ()  # every gap between consecutive chunks, pooled


@dataclass(frozen=True, slots=True)
class Curve:
    system: str
    levels: tuple[Level, ...]  # ascending concurrency

    @property
    def max_concurrency(self) -> int:
        return self.levels[-1].concurrency

    def at(self, concurrency: int) -> Level:
        for level in self.levels:
            if level.concurrency == concurrency:
                return level
        raise KeyError(concurrency)


def load_curves(paths: Sequence[Path]) -> dict[str, Curve]:
    """Closed-loop streaming levels of every system in the given result files."""
    levels: dict[str, dict[int, Level]] = {}
    for path in paths:
        doc = json.loads(path.read_text(encoding="utf-8"))
        for run in doc.get("runs", ()):
            level = _level(run, path)
            if level is not None:
                # A later file wins for the same system and level (a re-measurement).
                levels.setdefault(run["system"], {})[level.concurrency] = level
    return {
        system: Curve(system, tuple(by_c[c] for c in sorted(by_c)))
        for system, by_c in levels.items()
    }


def _level(run: dict[str, Any], path: Path) -> Level | None:
    concurrency = run.get("concurrency")
    if concurrency is None or not run.get("stream", True):
        return None  # open-loop and non-streaming runs have no TTFT curve to offer
    samples = [s for s in run.get("samples", ()) if s.get("ok") and not s.get("warmup")]
    if not samples:
        return None
    summary = run["summary"]
    return Level(
        concurrency=int(concurrency),
        requests_per_s=float(summary["requests_per_s"]),
        output_tokens_per_s=float(summary["output_tokens_per_s"]),
        ttft_s=tuple(float(s["ttft"]) for s in samples),
        e2e_s=tuple(float(s["e2e"]) for s in samples),
        output_tokens=sum(float(s["output_tokens"]) for s in samples) / len(samples),
        prompt_tokens=sum(float(s.get("prompt_tokens") or 0) for s in samples) / len(samples),
        source=f"{path}#{run['system']}@c={concurrency}",
        prompt_tokens_s=tuple(int(s.get("prompt_tokens") or 0) for s in samples),
        output_tokens_s=tuple(int(s["output_tokens"]) for s in samples),
        itl_s=tuple(b - a for s in samples for a, b in pairwise(s.get("chunk_times", ()))),
    )


_LOAD_LINE = re.compile(
    r'^llmso_model_load_seconds_(sum|count)\{[^}]*model="(?P<model>[^"]+)"[^}]*\}\s+(?P<v>\S+)'
)


def load_cold_starts(texts: Iterable[str]) -> dict[str, float]:
    """Mean measured load time per model from Prometheus text (``/metrics`` scrapes)."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for text in texts:
        for line in text.splitlines():
            match = _LOAD_LINE.match(line)
            if match is None:
                continue
            target = sums if match.group(1) == "sum" else counts
            target[match.group("model")] = float(match.group("v"))
    return {m: sums[m] / counts[m] for m in sums if counts.get(m)}


# --------------------------------------------------------------------------- profile


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Slo(_Frozen):
    ttft_p95_ms: float | None = Field(None, gt=0)
    e2e_p95_ms: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _some(self) -> Slo:
        if self.ttft_p95_ms is None and self.e2e_p95_ms is None:
            raise ValueError("set ttft_p95_ms and/or e2e_p95_ms")
        return self


class Prices(_Frozen):
    machine_hour: float = Field(gt=0, description="Cost of one replica's machine per hour.")
    idle_machine_hour: float | None = Field(
        None, ge=0, description="Cost per hour of a machine kept with nothing loaded."
    )


class ModelProfile(_Frozen):
    system: str = Field(description="The measured system (bench label) that serves it.")
    rate_rps: float | tuple[float, ...] = Field(
        description="Poisson request rate, or 24 hourly rates (UTC hours 0..23)."
    )
    output_tokens: float = Field(gt=0, description="Mean output tokens per request.")
    prompt_tokens: float | None = Field(None, gt=0)
    slo: Slo | None = None
    prices: Prices | None = None
    cold_start_s: float | None = Field(None, ge=0, description="Used when no scrape has one.")
    idle_ttl_s: float = Field(600.0, gt=0, description="Unload after this long idle (lazy).")
    max_queue: int = Field(256, gt=0)
    max_replicas: int = Field(16, gt=0)

    @field_validator("rate_rps")
    @classmethod
    def _rates(cls, value: float | tuple[float, ...]) -> float | tuple[float, ...]:
        if isinstance(value, tuple):
            if len(value) != 24 or any(v < 0 for v in value):
                raise ValueError("hourly rate_rps needs 24 non-negative values")
            if max(value) <= 0:
                raise ValueError("every hourly rate is 0")
        elif value <= 0:
            raise ValueError("rate_rps must be > 0")
        return value

    @property
    def hourly(self) -> tuple[float, ...]:
        return self.rate_rps if isinstance(self.rate_rps, tuple) else (self.rate_rps,) * 24

    @property
    def peak_rps(self) -> float:
        return max(self.hourly)


class Profile(_Frozen):
    slo: Slo | None = None
    prices: Prices
    models: dict[str, ModelProfile] = Field(min_length=1)

    @model_validator(mode="after")
    def _slo_everywhere(self) -> Profile:
        for name, model in self.models.items():
            if model.slo is None and self.slo is None:
                raise ValueError(f"model {name!r}: no slo (set one here or at the top)")
        return self

    def slo_of(self, name: str) -> Slo:
        slo = self.models[name].slo or self.slo
        assert slo is not None  # checked by _slo_everywhere
        return slo

    def prices_of(self, name: str) -> Prices:
        return self.models[name].prices or self.prices


def load_profile(path: Path) -> Profile:
    return Profile.model_validate(yaml.safe_load(path.read_text(encoding="utf-8")))
