"""The rate → latency step: a continuous-batching engine, fitted to a measured curve and
simulated under Poisson arrivals.

What the engine does (``backends/hf/engine/scheduler.py``, and vLLM's scheduler alike): it runs
steps, one packed forward each. A step decodes one token for every running sequence and
prefills the prompts admitted at its start; a request that arrives during a step waits
for the step's end; at most ``max_num_seqs`` sequences run, later arrivals wait FIFO
(and are rejected beyond ``max_queue``). A request's first token comes at the end of its
prefill step, its last ``output_tokens - 1`` steps later.

Step times, fitted to the closed-loop levels of one ``llmso bench`` curve
(:func:`fit_engine`):

- a step of only prefills costs ``a + b·P`` (``P`` prompt tokens in it): a Theil-Sen line
  (median of pairwise slopes, robust to a few stalled requests) through TTFT against
  prompt tokens at concurrency 1, where each TTFT is exactly one such step (plus the
  gateway's own few milliseconds, which ``a`` absorbs);
- a step decoding ``d`` sequences costs ``s(d)``: the median inter-token gap measured at
  concurrency ``d``, linear between measured levels (the lowest level's below it, and a
  note names the batch sizes so interpolated: the cost need not be monotone in ``d``);
  ``d`` never exceeds ``max_num_seqs``, which is a measured level, so nothing is
  extrapolated;
- a step decoding ``d`` and prefilling ``P`` costs ``s(d) + b·P`` (an assumption: the
  forward's fixed cost is paid once; closed-loop levels run in lockstep and never show
  such a step).

Steps are not all alike (other processes on the machine, the allocator, the event loop):
each simulated step's time is its fitted time times a factor drawn from what was measured
at concurrency 1: decode steps from ``ITL / median ITL``, prefill steps from
``TTFT / fitted TTFT``. So a noisy machine's calibration predicts a noisy tail, and a
slow step delays everything behind it, as it does in the engine. :func:`simulate` runs the
engine over many simulated requests (deterministic seed) and reads quantiles from the
simulated distribution; :func:`replay` runs it over a given schedule instead (a replayed
load test's realised arrivals and prompts), many times, to compare with what was measured
on that schedule.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from bench.plan.inputs import Curve


@dataclass(frozen=True, slots=True)
class EngineModel:
    """Step times of one engine, fitted to measured levels up to ``max_num_seqs``."""

    prefill_fixed_s: float  # a
    prefill_per_token_s: float  # b
    decode_steps: tuple[tuple[int, float], ...]  # (measured concurrency, median ITL)
    decode_jitter: tuple[float, ...]  # ITL / median ITL at the lowest level
    prefill_jitter: tuple[float, ...]  # TTFT / fitted TTFT at the lowest level
    prompt_tokens: tuple[int, ...]  # the measured prompts' lengths
    sources: tuple[str, ...]
    notes: tuple[str, ...]

    def decode_step(self, batch: int) -> float:
        """``s(batch)``, linear between measured levels; never above the highest one."""
        steps = self.decode_steps
        if batch <= steps[0][0]:
            return steps[0][1]
        for (c0, s0), (c1, s1) in itertools.pairwise(steps):
            if c0 <= batch <= c1:
                return s0 + (s1 - s0) * (batch - c0) / (c1 - c0)
        raise ValueError(f"batch {batch} is above the highest measured level {steps[-1][0]}")

    @property
    def mean_prompt_tokens(self) -> float:
        return sum(self.prompt_tokens) / len(self.prompt_tokens)


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Theil-Sen intercept and slope; slope 0 when ``xs`` do not vary."""
    points = list(zip(xs, ys, strict=True))
    slopes = [
        (y1 - y0) / (x1 - x0)
        for (x0, y0), (x1, y1) in itertools.combinations(points, 2)
        if abs(x1 - x0) > 1e-9
    ]
    slope = statistics.median(slopes) if slopes else 0.0
    return statistics.median(y - slope * x for x, y in points), slope


def fit_engine(curve: Curve, max_num_seqs: int) -> EngineModel:
    """Fit the step times to ``curve``'s levels up to ``max_num_seqs`` (a measured level)."""
    used = [lv for lv in curve.levels if lv.concurrency <= max_num_seqs]
    if max_num_seqs not in {lv.concurrency for lv in used}:
        raise ValueError(f"max_num_seqs {max_num_seqs} is not a measured level of {curve.system}")
    notes: list[str] = []
    low = used[0]
    if low.concurrency != 1:
        notes.append(
            f"no concurrency-1 level: prefill fitted at c={low.concurrency}, where a TTFT "
            "may include other requests' steps (pessimistic)"
        )
    prompts = [float(p) for p in low.prompt_tokens_s] or [low.prompt_tokens] * len(low.ttft_s)
    a, b = _line(prompts, list(low.ttft_s))
    if b < 0:
        a, b = statistics.median(low.ttft_s), 0.0
        notes.append("TTFT does not grow with prompt tokens here: prefill taken as constant")
    elif a < 0:
        a = 0.0  # a noisy line through the origin's far side; a step costs at least nothing
    elif b == 0:
        notes.append("all measured prompts had one length: prefill cost per token unknown")
    decode: list[tuple[int, float]] = []
    for lv in used:
        if lv.itl_s:
            decode.append((lv.concurrency, statistics.median(lv.itl_s)))
    if not decode:
        raise ValueError(f"{curve.system}: no inter-token gaps measured (stream with >1 token)")
    if decode[-1][0] != max_num_seqs:
        raise ValueError(f"{curve.system}@c={max_num_seqs}: no inter-token gaps measured")
    skipped = sorted(set(range(decode[0][0], max_num_seqs + 1)) - {c for c, _ in decode})
    if skipped:
        # A forward's cost need not be monotone in the batch (kernels pick paths by
        # shape): SmolLM2's hf decode step at batch 3 measured 50 % above batch 4.
        notes.append(
            f"decode step at batch {', '.join(map(str, skipped))} interpolated between "
            "measured levels (measure every level up to max_num_seqs to know them)"
        )
    lowest = next(lv for lv in used if lv.itl_s)
    step_low = statistics.median(lowest.itl_s)
    return EngineModel(
        prefill_fixed_s=a,
        prefill_per_token_s=b,
        decode_steps=tuple(decode),
        decode_jitter=tuple(g / step_low for g in lowest.itl_s),
        prefill_jitter=tuple(
            t / max(a + b * p, 1e-6) for t, p in zip(low.ttft_s, prompts, strict=True)
        ),
        prompt_tokens=tuple(round(p) for p in prompts),
        sources=tuple(lv.source for lv in used),
        notes=tuple(notes),
    )


@dataclass(frozen=True, slots=True)
class Simulated:
    """Latencies of the accepted simulated requests (warm-up dropped), in seconds."""

    ttft_s: tuple[float, ...]
    e2e_s: tuple[float, ...]
    offered: int
    rejected: int
    queued: int  # arrivals that found max_num_seqs sequences running or waiting


def simulate(
    engine: EngineModel,
    *,
    rate: float,
    output_tokens: float,
    max_num_seqs: int,
    max_queue: int,
    prompt_scale: float = 1.0,
    requests: int = 4000,
    warmup: int = 200,
    seed: int = 0,
) -> Simulated:
    """Run the engine (module docstring) over ``warmup + requests`` Poisson arrivals, each
    with a prompt length drawn from the measured ones (times ``prompt_scale``)."""
    rng = random.Random(seed)
    total = warmup + requests
    arrivals = list(itertools.accumulate(rng.expovariate(rate) for _ in range(total)))
    prompts = [rng.choice(engine.prompt_tokens) for _ in range(total)]
    return replay(
        engine,
        arrivals=arrivals,
        prompt_tokens=prompts,
        prompt_scale=prompt_scale,
        output_tokens=output_tokens,
        max_num_seqs=max_num_seqs,
        max_queue=max_queue,
        warmup=warmup,
        rounds=1,
        rng=rng,
    )


def replay(
    engine: EngineModel,
    *,
    arrivals: Sequence[float],
    prompt_tokens: Sequence[int],
    output_tokens: float,
    max_num_seqs: int,
    max_queue: int,
    prompt_scale: float = 1.0,
    warmup: int = 0,
    rounds: int = 200,
    seed: int = 0,
    rng: random.Random | None = None,
) -> Simulated:
    """Run the engine over one given schedule (``arrivals``, ascending, with each request's
    ``prompt_tokens``, whose prefill cost ``prompt_scale`` rescales) ``rounds`` times, each
    with fresh step-time factors (drawn from ``rng``, default seeded by ``seed``), and pool
    the latencies of the requests after the first ``warmup`` over all rounds.

    A replayed load test's realised arrivals and prompts, predicted this way, take the
    sampling of arrivals out of a comparison with what was measured on them."""
    if len(arrivals) != len(prompt_tokens):
        raise ValueError("one prompt length per arrival")
    rng = rng or random.Random(seed)
    per_token = engine.prefill_per_token_s * prompt_scale
    prefill = [per_token * p for p in prompt_tokens]
    ttft: list[float] = []
    e2e: list[float] = []
    rejected = queued = 0
    for _ in range(rounds):
        run = _run(
            engine,
            arrivals,
            prefill,
            output_tokens=output_tokens,
            max_num_seqs=max_num_seqs,
            max_queue=max_queue,
            rng=rng,
            warmup=warmup,
        )
        ttft += run.ttft(warmup)
        e2e += run.e2e(warmup)
        rejected += run.rejected
        queued += run.queued
    offered = (len(arrivals) - warmup) * rounds
    return Simulated(tuple(ttft), tuple(e2e), offered, rejected, queued)


@dataclass(frozen=True, slots=True)
class _Run:
    """Per-request latencies of one simulated schedule (``nan``: rejected)."""

    ttft_s: list[float]
    e2e_s: list[float]
    rejected: int  # counted from ``warmup`` on
    queued: int

    def _kept(self, warmup: int) -> list[int]:
        return [i for i in range(warmup, len(self.e2e_s)) if not math.isnan(self.e2e_s[i])]

    def ttft(self, warmup: int) -> tuple[float, ...]:
        return tuple(self.ttft_s[i] for i in self._kept(warmup))

    def e2e(self, warmup: int) -> tuple[float, ...]:
        return tuple(self.e2e_s[i] for i in self._kept(warmup))


def _run(
    engine: EngineModel,
    arrivals: Sequence[float],
    prefill: Sequence[float],
    *,
    output_tokens: float,
    max_num_seqs: int,
    max_queue: int,
    rng: random.Random,
    warmup: int,
) -> _Run:
    """The engine's steps over ``arrivals`` (each request's prefill cost in ``prefill``).

    Between events the batch is constant, so the loop jumps over runs of identical decode
    steps: its cost is a few iterations per request, not one per token.
    """
    total = len(arrivals)
    out = max(1, round(output_tokens))
    prefill_jitter, decode_jitter = engine.prefill_jitter, engine.decode_jitter
    steps = [0.0] + [engine.decode_step(d) for d in range(1, max_num_seqs + 1)]
    ttft = [math.nan] * total
    e2e = [math.nan] * total
    waiting: deque[int] = deque()
    running: list[tuple[int, int]] = []  # (step of its last token, request)
    rejected = queued = 0
    clock, step, nxt = 0.0, 0, 0
    while nxt < total or waiting or running:
        while nxt < total and arrivals[nxt] <= clock:
            if len(waiting) >= max_queue:
                rejected += nxt >= warmup
            else:
                queued += nxt >= warmup and len(running) + len(waiting) >= max_num_seqs
                waiting.append(nxt)
            nxt += 1
        if not running and not waiting:
            clock = arrivals[nxt]  # an idle engine takes the next arrival at once
            continue
        batch = len(running)
        if waiting and batch < max_num_seqs:
            admitted = [waiting.popleft() for _ in range(min(max_num_seqs - batch, len(waiting)))]
            base = engine.prefill_fixed_s if batch == 0 else steps[batch]
            clock += (base + sum(prefill[i] for i in admitted)) * rng.choice(prefill_jitter)
            step += 1
            for i in admitted:
                ttft[i] = clock - arrivals[i]
                heapq.heappush(running, (step - 1 + out, i))
        else:
            length = steps[batch]
            jump = running[0][0] - step
            if nxt < total and batch < max_num_seqs:
                # the next arrival joins at the first step boundary after it
                jump = min(jump, max(1, math.ceil((arrivals[nxt] - clock) / length - 1e-12)))
            clock += length * sum(rng.choices(decode_jitter, k=jump))
            step += jump
        while running and running[0][0] <= step:
            _, i = heapq.heappop(running)
            e2e[i] = clock - arrivals[i]
    return _Run(ttft, e2e, rejected, queued)
