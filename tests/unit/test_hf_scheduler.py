"""The continuous scheduler's slot bookkeeping, checked against a fake runner.

The fake runner keeps each cache slot's token history as a list and "predicts" a token
that depends on the whole history of the slot it reads. If any move, fork or compaction
put a sequence's keys in the wrong slot (or lost some), its outputs would differ from
the same request run alone.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch

from backends.base import GenerationRequest, RequestKind, SamplingParams, Tenant, TextDelta
from backends.hf.engine.detokenizer import TokenTable
from backends.hf.engine.outputs import StepOutputs
from backends.hf.engine.scheduler import ContinuousScheduler
from backends.hf.engine.sequence import RequestState, make_choices
from backends.hf.model.slot_attention import PrefillChunk

VOCAB = 50
EOS = 0


class FakeTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"<{i}>" for i in ids)

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return f"<{token_id}>"


class FakeCache:
    def __init__(self, max_slots: int) -> None:
        self.max_slots = max_slots
        self.slots: dict[int, list[int]] = {}

    def ensure(self, slots: int, capacity: int) -> None:
        assert slots <= self.max_slots

    def move(self, src: int, dst: int, length: int) -> None:
        assert 0 <= dst < self.max_slots
        if src != dst:
            self.slots[dst] = list(self.slots[src][:length])


class FakeRunner:
    def __init__(self, max_slots: int) -> None:
        self.cache = FakeCache(max_slots)
        self.max_context = 4096
        self.calls: list[tuple[int, list[PrefillChunk]]] = []  # (decode rows, chunks)

    def _write(self, slot: int, start: int, tokens: tuple[int, ...] | list[int]) -> int:
        history = self.cache.slots.setdefault(slot, [])
        del history[start:]
        assert len(history) == start, "keys missing before the written position"
        history.extend(tokens)
        return hash(tuple(history)) % (VOCAB - 1) + 1

    def forward(
        self,
        decode_tokens: list[int],
        decode_positions: list[int],
        prefills: list[PrefillChunk],
        decode_adapters: list[int] | None = None,
    ) -> torch.Tensor:
        self.calls.append((len(decode_tokens), list(prefills)))
        preds = [
            self._write(slot, pos, [tok])
            for slot, (tok, pos) in enumerate(zip(decode_tokens, decode_positions, strict=True))
        ]
        for chunk in prefills:
            pred = self._write(chunk.slot, chunk.start, chunk.tokens)
            if chunk.want_logits:
                preds.append(pred)
        logits = torch.full((len(preds), VOCAB), -10.0)
        for row, pred in enumerate(preds):
            logits[row, pred] = 10.0
        return logits


def _state(prompt: list[int], max_tokens: int, n: int = 1) -> RequestState:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, n=n)
    request = GenerationRequest(
        request_id="r", model="m", kind=RequestKind.COMPLETION, sampling=params
    )
    state = RequestState(
        request=request,
        sink=object(),
        prompt_ids=prompt,
        max_tokens=max_tokens,
        queued_at=0.0,
        eos_ids=frozenset({EOS}),
    )
    make_choices(state, FakeTokenizer(), torch.device("cpu"))
    return state


def _scheduler(
    max_seqs: int,
    budget: int,
    *,
    runner: FakeRunner | None = None,
    newcomer_steps: bool = True,
    prefill_chunk: int = 7,
    fixed_prefill: Callable[[int], bool] | None = None,
) -> ContinuousScheduler:
    return ContinuousScheduler(
        runner or FakeRunner(max_seqs + 1),  # type: ignore[arg-type]
        TokenTable(FakeTokenizer()),
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        observer=None,
        newcomer_steps=newcomer_steps,
        prefill_chunk=prefill_chunk,
        fixed_prefill=fixed_prefill,
    )


def _texts(out: StepOutputs, states: list[RequestState]) -> list[list[str]]:
    by_sink: dict[int, dict[int, str]] = {id(s.sink): {} for s in states}
    for sink, item in out:
        if isinstance(item, TextDelta):
            texts = by_sink[id(sink)]
            texts[item.index] = texts.get(item.index, "") + item.text
    return [[by_sink[id(s.sink)].get(i, "") for i in range(s.n)] for s in states]


def _run(sched: ContinuousScheduler, arrivals: dict[int, list[RequestState]]) -> StepOutputs:
    out: StepOutputs = []
    step = 0
    while sched.has_work() or any(k >= step for k in arrivals):
        for state in arrivals.get(step, []):
            sched.add(state, out)
        if sched.has_work():
            sched.step(out)
        step += 1
        assert step < 10_000
    return out


@pytest.mark.parametrize("keys", [1, 3])
def test_concurrent_staggered_requests_equal_alone(keys: int) -> None:
    """With several client keys (``keys`` 3: one key sends most requests, so the others'
    arrive as newcomer steps, see ``scheduler.py``) every output still equals the same
    request run alone."""
    rng = random.Random(7)
    specs = [
        (
            [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))],
            rng.randrange(1, 15),
            rng.choice([1, 1, 1, 2, 3]),
        )
        for _ in range(40)
    ]
    alone = []
    for prompt, max_tokens, n in specs:
        state = _state(prompt, max_tokens, n)
        out = _run(_scheduler(4, 64), {0: [state]})
        alone.append(_texts(out, [state])[0])
    states = [_state(p, m, n) for p, m, n in specs]
    for index, state in enumerate(states):
        key = "a" if index % 4 else f"k{index % keys}"
        state.request = replace(state.request, tenant=Tenant(key if keys > 1 else ""))
    arrivals: dict[int, list[RequestState]] = {}
    for state in states:
        arrivals.setdefault(rng.randrange(0, 60), []).append(state)
    sched = _scheduler(6, 16)
    newcomer_steps = 0

    def counted(out: StepOutputs) -> None:
        nonlocal newcomer_steps
        decoding = bool(sched.decoding)
        ContinuousScheduler.step(sched, out)
        newcomer_steps += decoding and sched._newcomers_last

    sched.step = counted  # type: ignore[method-assign]
    out = _run(sched, arrivals)
    assert _texts(out, states) == alone
    assert (newcomer_steps > 0) == (keys > 1)
    assert not sched.decoding and not sched.prefilling and not sched.waiting


def test_aborts_free_slots_and_leave_others_intact() -> None:
    prompts = [[i + 1] * (3 + i) for i in range(8)]
    alone = []
    for prompt in prompts:
        state = _state(prompt, 12)
        alone.append(_texts(_run(_scheduler(8, 64), {0: [state]}), [state])[0])
    states = [_state(p, 12) for p in prompts]
    sched = _scheduler(8, 64)
    out: StepOutputs = []
    for state in states:
        sched.add(state, out)
    for _ in range(4):
        sched.step(out)
    states[2].aborted = True
    sched.abort(states[2])
    while sched.has_work():
        sched.step(out)
    texts = _texts(out, states)
    assert [t for i, t in enumerate(texts) if i != 2] == [a for i, a in enumerate(alone) if i != 2]
    assert len(texts[2][0]) < len(alone[2][0])


def test_every_chunk_of_a_long_prompt_asks_for_fixed_size_calls() -> None:
    """The runner's rule is read from the prompt's length, so a long prompt's chunks
    (split here by a 7-token chunk) all say so, and a short prompt's none."""
    runner = FakeRunner(3)
    long, short = _state(list(range(3, 23)), 2), _state([5, 6, 7], 2)
    _run(_scheduler(2, 64, runner=runner, fixed_prefill=lambda n: n >= 10), {0: [long, short]})
    chunks = [chunk for _, step in runner.calls for chunk in step]
    fixed = [c for c in chunks if c.fixed]
    assert len(fixed) > 1 and sum(len(c.tokens) for c in fixed) == 20
    assert {c.tokens[0] for c in chunks if not c.fixed} <= {5, 6, 7}  # the short one's
    assert sum(len(c.tokens) for c in chunks if not c.fixed) == 3


def test_a_burst_into_an_idle_engine_starts_after_one_chunk() -> None:
    """Three prompts arriving together: the first step prefills one chunk's worth
    (``prefill_chunk``, 7 here), not the whole budget, so the first prompt's token comes
    after that chunk; a prompt alone still takes the budget in one step."""
    runner = FakeRunner(4)
    sched = _scheduler(3, 64, runner=runner)
    burst = [_state([5, 6, 7, 8, 9], 2) for _ in range(3)]
    out = _run(sched, {0: burst})
    (decoding, first), *_ = runner.calls
    assert decoding == 0 and sum(len(c.tokens) for c in first) == 7
    assert first[0].want_logits and len(first[0].tokens) == 5  # the first prompt finished
    assert all(len(texts[0]) > 0 for texts in _texts(out, burst))
    runner = FakeRunner(2)
    alone = _state(list(range(3, 23)), 2)
    _run(_scheduler(1, 64, runner=runner), {0: [alone]})
    assert [len(c.tokens) for c in runner.calls[0][1]] == [20]
