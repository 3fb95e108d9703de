"""The comparison spec (YAML or JSON): which systems, how to start them, what load to apply.

Validated once here into frozen pydantic models; the driver never sees raw dicts. Strings in
``command``, ``env``, ``files``, ``base_url`` and ``health_url`` may hold placeholders the
driver fills in: ``{port}`` (a free port chosen for this entry), ``{port_<service>}`` (a
service's port), ``{workdir}`` (the run's scratch folder), and for reference systems also
``{out}``, ``{prompts}``, ``{num_requests}``, ``{warmup}``, ``{max_tokens}``, ``{api}``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ServiceSpec(_Frozen):
    """A helper process the systems need (e.g. a fake upstream); started first, not measured."""

    name: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_]*$")
    command: tuple[str, ...]
    env: dict[str, str] = {}
    files: dict[str, str] = Field(default={}, description="path -> content, written before start")
    health_url: str
    startup_timeout_s: float = Field(default=120.0, gt=0)


class SystemSpec(_Frozen):
    """One labelled system under test.

    ``kind: server``: an OpenAI-compatible server at ``base_url``, started from ``command``
    (or already running when ``command`` is empty). ``kind: reference``: a script run per
    concurrency-1 level that writes its own samples to ``{out}`` (see ``bench.reference``).
    """

    label: str = Field(min_length=1)
    kind: Literal["server", "reference"] = "server"
    command: tuple[str, ...] = ()
    env: dict[str, str] = {}
    env_unset: tuple[str, ...] = Field(
        default=(), description="Variables of the harness's environment the command must not see."
    )
    files: dict[str, str] = {}
    base_url: str | None = None
    model: str | None = None
    health_url: str | None = None
    startup_timeout_s: float = Field(default=600.0, gt=0)
    ignore_eos: bool | None = None
    extra_body: dict[str, object] = {}
    cpu_of: str | None = Field(
        default=None, description="Service whose CPU counts as this system's (no command)."
    )
    cwd: str | None = Field(
        default=None, description="Folder to start the command in (created when missing)."
    )

    @model_validator(mode="after")
    def _check(self) -> SystemSpec:
        if self.kind == "server" and not self.base_url:
            raise ValueError(f"system {self.label!r}: a server needs base_url")
        if self.kind == "reference" and not self.command:
            raise ValueError(f"system {self.label!r}: a reference needs a command")
        return self


class CompareSpec(_Frozen):
    title: str = "llmso bench compare"
    api: Literal["chat", "completions"] = "chat"
    model: str | None = Field(default=None, description="Default model name for every system.")
    max_tokens: int = Field(default=64, gt=0)
    temperature: float = Field(default=0.0, ge=0)
    ignore_eos: bool = True
    streams: tuple[bool, ...] = (True,)
    concurrency: tuple[int, ...] = (1, 4, 16)
    min_requests: int = Field(default=8, gt=0)
    requests_per_concurrency: int = Field(default=2, gt=0)
    warmup: int = Field(default=2, ge=0)
    timeout_s: float = Field(default=300.0, gt=0, description="Per request.")
    level_duration_s: float | None = Field(
        default=300.0, gt=0, description="Stop issuing requests of one level after this long."
    )
    slo_ttft_ms: float | None = Field(default=None, gt=0)
    slo_itl_ms: float | None = Field(default=None, gt=0)
    baseline: str | None = Field(
        default=None, description="Label the overhead table compares against."
    )
    pause_idle: bool = Field(
        default=False, description="SIGSTOP systems while others are measured."
    )
    rounds: int = Field(
        default=1,
        ge=1,
        description="Measure every level this many times, the systems interleaved within "
        "each round; a system's figures pool its rounds, its CPU per request is the median.",
    )
    prompts_file: str | None = None
    workload: Literal["mixed", "shared-prefix"] = Field(
        default="mixed",
        description="Built-in prompts: mixed lengths, or one ~1,000-token shared prefix.",
    )
    client: Literal["aiohttp", "native"] = Field(
        default="aiohttp",
        description="The load client: bench.client's (aiohttp, every chunk parsed), or the "
        "C client of bench.native_load (closed-loop levels, one body, a few us a chunk).",
    )
    notes: tuple[str, ...] = ()
    services: tuple[ServiceSpec, ...] = ()
    systems: tuple[SystemSpec, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> CompareSpec:
        labels = [s.label for s in self.systems]
        if len(set(labels)) != len(labels):
            raise ValueError("system labels must be unique")
        names = {s.name for s in self.services}
        for system in self.systems:
            if system.cpu_of is not None and system.cpu_of not in names:
                raise ValueError(f"system {system.label!r}: cpu_of {system.cpu_of!r} unknown")
        if self.baseline is not None and self.baseline not in labels:
            raise ValueError(f"baseline {self.baseline!r} is not a system label")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency levels must be >= 1")
        if not self.streams:
            raise ValueError("streams must not be empty")
        return self

    def requests_for(self, concurrency: int) -> int:
        return max(self.min_requests, self.requests_per_concurrency * concurrency)


def load_spec(path: Path) -> CompareSpec:
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    return CompareSpec.model_validate(data)


_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def fill(template: str, values: dict[str, str]) -> str:
    """Replace known ``{name}`` placeholders; unknown braces (YAML, JSON) stay as they are."""
    return _PLACEHOLDER.sub(lambda m: values.get(m.group(1), m.group(0)), template)
