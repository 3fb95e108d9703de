"""The comparison driver: start every system, then alternate between them level by level.

For each concurrency level and stream mode, every system runs the same prompts with the same
token budget before the next level starts, and the order of systems rotates by one per level,
so slow drift of the machine (thermal, other tenants) hits all systems alike. With
``rounds`` above one, a level is measured that many times, every system once per round
(the order rotating again), and each system's rounds are pooled (``pooled``): a burst of
noise on a shared machine then moves one round of each figure, not the figure. Results are
rewritten after every level, so an interrupted run still leaves its finished levels on disk.

Ownership: :func:`run_compare` owns the processes it starts and stops them all (process
groups, SIGTERM then SIGKILL) on every exit path, including cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.client import RequestOptions, RequestResult
from bench.loadgen import LevelRun, LoadSpec, new_session, run_level
from bench.machine import machine_info
from bench.native_load import CLIENT, NativeToolError, run_native_level
from bench.procstat import CpuWindow
from bench.prompts import Prompt, builtin_prompts, load_prompts, shared_prefix_prompts
from bench.report import RunRecord, markdown_table, overhead_table, plot, write_json
from bench.spec import CompareSpec, ServiceSpec, SystemSpec, fill
from bench.stats import Slo, summarize
from bench.systems import ManagedProcess, StartupError, free_port

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Live:
    """A system's runtime state; owned by :func:`run_compare`."""

    spec: SystemSpec
    values: dict[str, str]
    process: ManagedProcess | None = None
    failed: str | None = None
    startup_s: float | None = None
    records: list[RunRecord] = field(default_factory=list)


def _write_files(files: dict[str, str], values: dict[str, str]) -> None:
    for raw_path, content in files.items():
        path = Path(fill(raw_path, values))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(fill(content, values), encoding="utf-8")


def _fill_all(parts: tuple[str, ...], values: dict[str, str]) -> list[str]:
    return [fill(part, values) for part in parts]


def _prompts(spec: CompareSpec, workdir: Path) -> tuple[tuple[Prompt, ...], Path]:
    need = max(spec.requests_for(c) for c in spec.concurrency) + spec.warmup
    if spec.prompts_file:
        prompts = load_prompts(Path(spec.prompts_file))
    elif spec.workload == "shared-prefix":
        prompts = shared_prefix_prompts(need)
    else:
        prompts = builtin_prompts(need)
    path = workdir / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p.text}) + "\n" for p in prompts), "utf-8")
    return prompts, path


def _machine_lines(meta: dict[str, Any]) -> list[str]:
    versions = ", ".join(f"{k} {v}" for k, v in (meta.get("versions") or {}).items() if v)
    return [
        f"- command: `{meta.get('command') or ' '.join(meta.get('argv') or ())}`",
        f"- machine: {meta.get('cpu_model')}, {meta.get('cpus_usable')} usable CPUs, "
        f"{meta.get('mem_total_gib')} GiB RAM, {meta.get('platform')}",
        f"- load average at start: {meta.get('loadavg_at_start')}; "
        f"run {meta.get('started_at')} to {meta.get('finished_at')}; "
        f"git {meta.get('git_commit')}",
        f"- python {meta.get('python')}; {versions}",
        f"- server startup seconds: {meta.get('startup_s')}",
    ]


def write_outputs(
    out_dir: Path, spec: CompareSpec, records: list[RunRecord], meta: dict[str, Any]
) -> None:
    """results.json, results.md and results.png under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "results.json", records, meta)
    lines = [f"# {spec.title}", ""]
    lines += [f"- {note}" for note in spec.notes]
    for label, why in (meta.get("failed") or {}).items():
        first = why.strip().splitlines()[0] if why.strip() else "?"
        lines.append(f"- **{label} failed**: {first} (full log tail in results.json)")
    lines += ["", markdown_table(records)]
    if spec.baseline:
        lines += [
            f"## Overhead against `{spec.baseline}`",
            "",
            overhead_table(records, spec.baseline),
        ]
    lines += ["![latency vs throughput](results.png)", "", "## Machine and command", ""]
    lines += [*_machine_lines(meta), ""]
    (out_dir / "results.md").write_text("\n".join(lines), encoding="utf-8")
    if records:
        plot(out_dir / "results.png", records, spec.title)


def summarised(
    label: str, load: LoadSpec, run: LevelRun, *, stream: bool, slo: Slo, server_cpu: float | None
) -> RunRecord:
    """The record of one level's run (``server_cpu``: the server's CPU seconds over its
    measured requests, if known); also what ``llmso bench run`` writes per level."""
    summary = summarize(run.results, slo, wall_s=run.wall_s)
    n = max(summary.requests, 1)
    return RunRecord(
        system=label,
        load=load.label,
        concurrency=load.concurrency,
        rate=load.rate,
        stream=stream,
        summary=summary,
        client_cpu_ms_per_request=run.client_cpu_s * 1000 / n,
        server_cpu_ms_per_request=None if server_cpu is None else server_cpu * 1000 / n,
        samples=run.results,
    )


def pooled(rounds: Sequence[RunRecord], slo: Slo) -> RunRecord:
    """One system's rounds of one level as one record: latency and throughput over the
    samples of every round (their walls added), CPU per request the median round's, each
    round's kept in ``server_cpu_rounds`` and each round's summary in ``round_summaries``."""
    if len(rounds) == 1:
        return rounds[0]
    samples = tuple(sample for record in rounds for sample in record.samples)
    wall = sum(record.summary.wall_s for record in rounds)
    servers = [
        r.server_cpu_ms_per_request for r in rounds if r.server_cpu_ms_per_request is not None
    ]
    clients = [
        r.client_cpu_ms_per_request for r in rounds if r.client_cpu_ms_per_request is not None
    ]
    return dataclasses.replace(
        rounds[0],
        summary=summarize(samples, slo, wall_s=wall),
        server_cpu_ms_per_request=statistics.median(servers) if servers else None,
        client_cpu_ms_per_request=statistics.median(clients) if clients else None,
        samples=samples,
        server_cpu_rounds=tuple(servers),
        round_summaries=tuple(record.summary for record in rounds),
    )


class _Driver:
    """One comparison run. Owned by the coroutine in :func:`run_compare`; not thread-safe."""

    def __init__(
        self, spec: CompareSpec, session: aiohttp.ClientSession, out_dir: Path, workdir: Path
    ) -> None:
        self.spec = spec
        self.session = session
        self.out_dir = out_dir
        self.workdir = workdir
        self.prompts, self.prompts_path = _prompts(spec, workdir)
        self.ports = {f"port_{s.name}": str(free_port()) for s in spec.services}
        self.base_values = {**self.ports, "workdir": str(workdir)}
        self.services: dict[str, ManagedProcess] = {}
        self.lives = [
            _Live(spec=s, values={**self.base_values, "port": str(free_port())})
            for s in spec.systems
        ]
        self.records: list[RunRecord] = []
        self.failed: dict[str, str] = {}

    async def _start(
        self, name: str, spec: ServiceSpec | SystemSpec, values: dict[str, str], health_url: str
    ) -> tuple[ManagedProcess, float]:
        _write_files(spec.files, values)
        cwd = None
        if isinstance(spec, SystemSpec) and spec.cwd is not None:
            cwd = Path(fill(spec.cwd, values))
            cwd.mkdir(parents=True, exist_ok=True)
        proc = ManagedProcess(
            name,
            _fill_all(spec.command, values),
            self.workdir / "logs" / f"{name}.log",
            env={k: fill(v, values) for k, v in spec.env.items()},
            cwd=cwd,
            unset=spec.env_unset if isinstance(spec, SystemSpec) else (),
        )
        log.info("starting %s: %s", name, " ".join(proc.command))
        proc.start()
        waited = await proc.wait_healthy(
            self.session, fill(health_url, values), spec.startup_timeout_s
        )
        log.info("%s healthy after %.1fs", name, waited)
        return proc, waited

    async def start_all(self) -> None:
        """Services first (a failure aborts), then systems one by one (a failure skips it)."""
        for service in self.spec.services:
            values = {**self.base_values, "port": self.ports[f"port_{service.name}"]}
            proc, _ = await self._start(service.name, service, values, service.health_url)
            self.services[service.name] = proc
        for live in self.lives:
            if live.spec.kind != "server" or not live.spec.command:
                continue
            health = live.spec.health_url or f"{live.spec.base_url}/models"
            try:
                live.process, live.startup_s = await self._start(
                    live.spec.label, live.spec, live.values, health
                )
            except StartupError as exc:
                self._fail(live, str(exc))

    def _fail(self, live: _Live, why: str) -> None:
        live.failed = why
        self.failed[live.spec.label] = why
        log.error("%s: %s", live.spec.label, why)

    def stop_all(self) -> None:
        for live in self.lives:
            if live.process is not None:
                live.process.stop()
        for proc in self.services.values():
            proc.stop()

    def _options(self, live: _Live, stream: bool) -> RequestOptions:
        system = live.spec
        model = system.model or self.spec.model
        if not model or not system.base_url:
            raise ValueError(f"system {system.label!r}: no model or base_url")
        return RequestOptions(
            base_url=fill(system.base_url, live.values),
            model=model,
            api=self.spec.api,
            stream=stream,
            max_tokens=self.spec.max_tokens,
            temperature=self.spec.temperature,
            ignore_eos=self.spec.ignore_eos if system.ignore_eos is None else system.ignore_eos,
            timeout_s=self.spec.timeout_s,
            extra_body=dict(system.extra_body),
        )

    async def _run_reference(self, live: _Live, load: LoadSpec) -> tuple[LevelRun, float]:
        """Run the reference script for one level; returns its samples and its CPU seconds."""
        out = self.workdir / f"reference-{live.spec.label}-{load.label}.json"
        values = {
            **live.values,
            "out": str(out),
            "prompts": str(self.prompts_path),
            "num_requests": str(load.num_requests),
            "warmup": str(load.warmup),
            "max_tokens": str(self.spec.max_tokens),
            "api": self.spec.api,
        }
        proc = ManagedProcess(
            live.spec.label,
            _fill_all(live.spec.command, values),
            self.workdir / "logs" / f"{live.spec.label}.log",
            env={k: fill(v, values) for k, v in live.spec.env.items()},
        )
        proc.start()
        requests = load.warmup + (load.num_requests or 1)
        budget = self.spec.timeout_s * requests + live.spec.startup_timeout_s
        t0 = time.monotonic()
        try:
            while proc.alive():
                if time.monotonic() - t0 > budget:
                    raise StartupError(f"reference exceeded {budget:g}s")
                await asyncio.sleep(0.5)
        finally:
            proc.stop()
        if not out.exists():
            raise StartupError(f"reference wrote no results; see {proc.log_path}")
        doc = json.loads(out.read_text(encoding="utf-8"))
        results = tuple(RequestResult.from_json(s) for s in doc["samples"])
        run = LevelRun(load=load, results=results, wall_s=float(doc["wall_s"]), client_cpu_s=0.0)
        return run, float(doc["cpu_s"])

    async def measure(self, live: _Live, load: LoadSpec, stream: bool) -> RunRecord:
        slo = Slo(self.spec.slo_ttft_ms, self.spec.slo_itl_ms)
        if live.spec.kind == "reference":
            # The reference's own process CPU plays the part of the server's.
            run, cpu = await self._run_reference(live, load)
            return summarised(live.spec.label, load, run, stream=stream, slo=slo, server_cpu=cpu)
        options = self._options(live, stream)
        measured = live.process
        if measured is None and live.spec.cpu_of is not None:
            measured = self.services[live.spec.cpu_of]
        # Read after the warm-up: only the measured requests' CPU counts.
        window = CpuWindow(measured.cpu_seconds if measured else lambda: None)
        if self.spec.client == "native":
            run = await run_native_level(
                CLIENT, options, self.prompts, load, self.workdir, on_measured=window.start
            )
        else:
            run = await run_level(self.session, options, self.prompts, load, window.start)
        server_cpu = window.seconds()
        return summarised(live.spec.label, load, run, stream=stream, slo=slo, server_cpu=server_cpu)

    def _isolate(self, live: _Live) -> None:
        for other in self.lives:
            if other.process is None:
                continue
            if other is live:
                other.process.resume()
            else:
                other.process.pause()

    async def run_level_for_all(self, k: int, concurrency: int) -> None:
        """One concurrency level: every system (order rotated by ``k`` and by round),
        every stream mode, ``rounds`` times."""
        load = LoadSpec(
            concurrency=concurrency,
            num_requests=self.spec.requests_for(concurrency),
            duration_s=self.spec.level_duration_s,
            warmup=self.spec.warmup,
        )
        slo = Slo(self.spec.slo_ttft_ms, self.spec.slo_itl_ms)
        for stream in self.spec.streams:
            measured: dict[str, list[RunRecord]] = {}
            for round_index in range(self.spec.rounds):
                shift = (k + round_index) % len(self.lives)
                for live in self.lives[shift:] + self.lives[:shift]:
                    record = await self._measure_one(live, load, stream, round_index)
                    if record is not None:
                        measured.setdefault(live.spec.label, []).append(record)
            # In the order the first round measured them.
            self.records.extend(pooled(rounds, slo) for rounds in measured.values())

    async def _measure_one(
        self, live: _Live, load: LoadSpec, stream: bool, round_index: int
    ) -> RunRecord | None:
        if live.failed or (live.spec.kind == "reference" and (load.concurrency != 1 or not stream)):
            return None
        if self.spec.pause_idle:
            self._isolate(live)
        log.info(
            "measuring %s %s stream=%s round %d/%d",
            live.spec.label,
            load.label,
            stream,
            round_index + 1,
            self.spec.rounds,
        )
        try:
            record = await self.measure(live, load, stream)
        except (StartupError, NativeToolError) as exc:
            self._fail(live, str(exc))
            return None
        s = record.summary
        cpu = record.server_cpu_ms_per_request
        log.info(
            "%s %s: ok %d/%d, %.1f tok/s, server CPU %s ms/req",
            live.spec.label,
            load.label,
            s.ok,
            s.requests,
            s.output_tokens_per_s,
            "-" if cpu is None else f"{cpu:.3f}",
        )
        if live.process is not None and not live.process.alive():
            self._fail(live, f"exited during {load.label}; see {live.process.log_path}")
        return record


async def run_compare(
    spec: CompareSpec, out_dir: Path, workdir: Path, meta_extra: dict[str, Any] | None = None
) -> list[RunRecord]:
    """Run the whole comparison; returns every record (also written under ``out_dir``)."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        **machine_info(),
        **(meta_extra or {}),
        "spec": spec.model_dump(mode="json"),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    async with new_session(max(spec.concurrency) + 4) as session:
        driver = _Driver(spec, session, out_dir, workdir)
        meta["failed"] = driver.failed
        try:
            await driver.start_all()
            meta["startup_s"] = {lv.spec.label: lv.startup_s for lv in driver.lives}
            for k, concurrency in enumerate(spec.concurrency):
                await driver.run_level_for_all(k, concurrency)
                meta["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
                write_outputs(out_dir, spec, driver.records, meta)
        finally:
            driver.stop_all()
            with contextlib.suppress(OSError):
                write_outputs(out_dir, spec, driver.records, meta)
    return driver.records
