"""Iteration-level (continuous) scheduling over the slot KV cache.

Owner: the engine thread. Three sets:

- ``waiting``: tokenized requests not yet admitted, priority first (with aging), then
  weighted fair share between client keys (``backends.hf.engine.waiting``): every step
  charges each request's key the slots it held in the step;
- ``prefilling``: admitted requests whose prompt is still being fed, chunk by chunk, into
  one cache slot (a request with ``n`` choices reserves ``n`` slots but prefills once);
- ``decoding``: choices generating tokens; ``decoding[i]`` always lives in cache slot
  ``i`` so the runner attends over a plain view of the first ``D`` slots.

Every ``step`` runs ONE packed forward: one token per decoding choice plus prefill chunks
within the step's token budget (``max_num_batched_tokens``; while others decode, or more
than one request waits or prefills, a step's prefill is also capped at ``prefill_chunk``,
so the decoding rows' inter-token latency stays bounded and in a burst the first prompts
start decoding after one chunk instead of after all of them). A request
that asked for its prompt's log-probabilities gets the logits of every prompt position
from that same forward (``prompt_scores.py``; its chunks are capped at ``prefill_chunk``
too, which bounds those logits' memory) and skips the prefix cache's lookup: a cached
block holds keys and values, not the logits its positions produce, so every position
must run through the model anyway, and copying the block first would only add a
memcpy. Its blocks are still stored for the requests after it. A request with
``max_tokens`` 0 ends when its prefill does, nothing sampled. Finished
or aborted choices leave at once; the last decoding choice moves into the hole (one slot
copy), nothing is recomputed. ``sequential`` is this same loop admitting one request at a
time.

A newcomer step: while one key holds at least ``max(2, max_num_seqs // 8)`` slots
(decoding or prefilling) and the waiting queue's next request belongs to a key that
holds none, the step prefills only such newcomers (one request per key, at most
``prefill_chunk`` tokens in all) and the decoding choices sit it out. Mixed into the
busy key's decode rows, a short question's first token would wait for a whole batched
decode step, so one key's streams would set every other key's time to first token
(``docs/benchmarks/fairness``). At most every other step is a newcomer step, so the
decoding choices still advance at least every second step, each pause at most one
bounded prefill chunk; with one key, or keys that hold few slots each, there are none.
``newcomer_steps: false`` (the model's config) turns them off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch

from backends.base import PromptLogprobs, Tenant
from backends.hf.engine.detokenizer import TokenTable
from backends.hf.engine.outputs import StepOutputs, accept_token, emit_started, finish_choice
from backends.hf.engine.prompt_scores import first_token, score_rows
from backends.hf.engine.sampler import sample
from backends.hf.engine.sequence import Choice, RequestState
from backends.hf.engine.waiting import WaitingQueue
from backends.hf.model.kv_cache import SlotKVCache
from backends.hf.model.prefix_cache import PrefixCache
from backends.hf.model.slot_attention import PrefillChunk
from backends.hop_metrics import WorkerObserver

PREFILL_CHUNK = 512


class SlotRunner(Protocol):
    """What the scheduler needs of a runner (``DecoderRunner``, ``ModuleRunner``)."""

    cache: SlotKVCache
    max_context: int

    def forward(
        self,
        decode_tokens: list[int],
        decode_positions: list[int],
        prefills: list[PrefillChunk],
        decode_adapters: list[int] | None = None,
    ) -> torch.Tensor: ...


class ContinuousScheduler:
    """See the module docstring."""

    def __init__(
        self,
        runner: SlotRunner,
        table: TokenTable,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        observer: WorkerObserver | None,
        one_at_a_time: bool = False,
        newcomer_steps: bool = True,
        prefill_chunk: int = PREFILL_CHUNK,
        prefix_cache: PrefixCache | None = None,
        adapter_place: Callable[[str], tuple[int, int]] | None = None,
        fixed_prefill: Callable[[int], bool] | None = None,
    ) -> None:
        self._runner = runner
        # Whether a prompt of so many tokens is prefilled in fixed-size calls
        # (``DecoderRunner.fixed_prefill``); None: no prompt is.
        self._fixed_prefill = fixed_prefill
        # An adapter's slot and load key in the runner's current bank, read at admission:
        # a pinned adapter (see AdapterPool) keeps its slot across bank swaps.
        self._adapter_place = adapter_place
        self._cache = runner.cache
        self._table = table
        self._max_seqs = max_num_seqs
        self._budget = max_num_batched_tokens
        self._observer = observer
        self._one_at_a_time = one_at_a_time
        self._newcomer_steps = newcomer_steps
        self._chunk = prefill_chunk
        self._prefix = prefix_cache
        self.waiting = WaitingQueue()
        self.prefilling: list[RequestState] = []
        self.prefill_slot: dict[int, int] = {}  # id(state) -> its cache slot
        self.decoding: list[Choice] = []
        self._in_step: list[RequestState] = []  # the requests the current step computes
        self._newcomers_last = False  # the last step was a newcomer step (module doc)

    # ------------------------------------------------------------------ policy API

    def add(self, state: RequestState, out: StepOutputs) -> None:
        self.waiting.append(state)

    def abort(self, state: RequestState) -> None:
        if state in self.waiting:
            self.waiting.remove(state)
        if state in self.prefilling:
            self.prefilling.remove(state)
            self.prefill_slot.pop(id(state), None)
        # decoding choices of an aborted request leave in _compact()
        self._compact()

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.decoding)

    def wait_hint(self) -> float | None:
        return None

    def open_requests(self) -> list[RequestState]:
        seen: dict[int, RequestState] = {}
        for state in (*self.waiting, *self.prefilling, *(c.request for c in self.decoding)):
            seen[id(state)] = state
        return list(seen.values())

    # ------------------------------------------------------------------ one step

    def step(self, out: StepOutputs) -> None:
        began = time.perf_counter()
        holding = self._holding()
        newcomers = self._newcomer_step(holding)
        self._newcomers_last = newcomers
        decode = [] if newcomers else list(self.decoding)
        self._in_step = [c.request for c in decode]
        chunks, owners, finishing = self._plan_prefill(out, holding, newcomers=newcomers)
        if not decode and not chunks:
            return
        logits = self._runner.forward(
            [c.next_input for c in decode],
            [c.length for c in decode],
            chunks,
            decode_adapters=[c.request.adapter for c in decode],
        )
        for choice in decode:
            choice.length += 1
        self._charge(decode, owners)
        last_rows = self._score_prompts(logits, len(decode), chunks, owners)
        rows: list[Choice] = list(decode)
        row_index = list(range(len(decode)))
        for state in finishing:
            self.prefilling.remove(state)
            if state.request.prompt_logprobs is not None:
                out.append((state.sink, PromptLogprobs(tuple(state.prompt_scores))))
                state.prompt_scores = []
            if state.max_tokens == 0:
                self._end_unsampled(state, out)
                continue
            self._fork(state)
            rows.extend(state.choices)
            row_index.extend([last_rows[id(state)]] * state.n)
        if rows:
            if row_index != list(range(logits.shape[0])):
                logits = logits.index_select(0, torch.tensor(row_index, device=logits.device))
            for choice, (token, logprob) in zip(
                rows, sample(logits, rows, self._table), strict=True
            ):
                accept_token(choice, token, logprob, out)
        num_tokens = len(decode) + sum(len(c.tokens) for c in chunks)
        batch = len(decode) + len(chunks)
        self._compact()
        if self._observer is not None:
            self._observer.on_step(batch, num_tokens, time.perf_counter() - began)
            if newcomers:
                self._observer.on_newcomer_step()
        self.report_load()

    def fail_step(self) -> list[RequestState]:
        """See ``StepPolicy.fail_step``: every decoding request and every request that
        fed a prefill chunk this step leaves; waiting requests and prefills the step
        did not reach stay."""
        failed = {id(state): state for state in self._in_step}
        self._in_step = []
        for state in failed.values():
            state.aborted = True
            if state in self.prefilling:
                self.prefilling.remove(state)
            self.prefill_slot.pop(id(state), None)
        self._compact()  # drops the aborted requests' decoding choices
        return list(failed.values())

    def report_load(self) -> None:
        if self._observer is not None:
            self._observer.on_load(
                len(self.decoding) + len(self.prefilling), len(self.waiting), self.kv_usage()
            )

    def kv_usage(self) -> float:
        used = sum(c.length for c in self.decoding) + sum(s.prefilled for s in self.prefilling)
        total = self._max_seqs * self._runner.max_context
        return used / total if total else 0.0

    def _reserved(self) -> int:
        return len(self.decoding) + sum(s.n for s in self.prefilling)

    def _charge(self, decode: list[Choice], owners: list[RequestState]) -> None:
        """The step's work against each request's key, in slot-steps: one per decoding
        choice, and one per choice a prefilling request holds a slot for (the waiting
        queue's fair share; see ``backends.hf.engine.waiting`` for why not tokens)."""
        work: dict[Tenant, int] = {}
        for choice in decode:
            tenant = choice.request.request.tenant
            work[tenant] = work.get(tenant, 0) + 1
        for state in owners:
            tenant = state.request.tenant
            work[tenant] = work.get(tenant, 0) + state.n
        for tenant, steps in work.items():
            self.waiting.charge(tenant, steps)

    def _score_prompts(
        self,
        logits: torch.Tensor,
        row: int,
        chunks: list[PrefillChunk],
        owners: list[RequestState],
    ) -> dict[int, int]:
        """Score the prompt tokens of every scoring chunk (``row``: its first logit row);
        returns each finishing prefill's last logit row, by ``id(state)``."""
        last_rows: dict[int, int] = {}
        for chunk, state in zip(chunks, owners, strict=True):
            if chunk.score:
                if chunk.start == 0:
                    state.prompt_scores.append(first_token(state.prompt_ids[0], self._table))
                scored = len(chunk.tokens) - (1 if chunk.want_logits else 0)
                if scored:
                    targets = state.prompt_ids[chunk.start + 1 : chunk.start + 1 + scored]
                    top = state.request.prompt_logprobs or 0
                    state.prompt_scores.extend(
                        score_rows(logits[row : row + scored], targets, top, self._table)
                    )
            row += chunk.logit_rows
            if chunk.want_logits:
                last_rows[id(state)] = row - 1
        return last_rows

    def _newcomer_step(self, holding: dict[str, int]) -> bool:
        """Whether this step is a newcomer step (see the module docstring); ``holding``:
        the slots each key holds (``_holding``)."""
        if not self._newcomer_steps or self._newcomers_last:
            return False
        if not self.decoding or not self.waiting:
            return False
        head = self.waiting.peek()
        if holding.get(head.request.tenant.name, 0):
            return False
        crowd = max(2, self._max_seqs // 8)
        return max(holding.values()) >= crowd and self._can_admit(head, holding)

    def _plan_prefill(
        self, out: StepOutputs, holding: dict[str, int], *, newcomers: bool = False
    ) -> tuple[list[PrefillChunk], list[RequestState], list[RequestState]]:
        """The step's prefill chunks, the request each belongs to, and the requests whose
        prefill they finish; in a newcomer step only requests of keys that hold no slot.
        ``holding`` (``_holding``) is updated as requests are admitted."""
        if newcomers:
            budget = min(self._budget, self._chunk)
        else:
            budget = self._budget - len(self.decoding)
            if self.decoding or len(self.waiting) + len(self.prefilling) > 1:
                # A burst into an idle engine too: the first prompts' tokens come after
                # one chunk, not after every prompt's (16 chats at once, SmolLM2: first
                # tokens at 0.2-1.1 s instead of all at 1.0 s)
                budget = min(budget, self._chunk)
        chunks: list[PrefillChunk] = []
        owners: list[RequestState] = []
        finishing: list[RequestState] = []
        for state in [] if newcomers else self.prefilling:
            if budget <= 0:
                break
            budget -= self._add_chunk(state, budget, chunks, finishing)
            owners.append(state)
        while self.waiting and budget > 0 and self._can_admit(self.waiting.peek(), holding):
            if newcomers and holding.get(self.waiting.peek().request.tenant.name, 0):
                break
            state = self.waiting.popleft()
            name = state.request.tenant.name
            holding[name] = holding.get(name, 0) + state.n
            if state.request.adapter is not None and self._adapter_place is not None:
                state.adapter, state.adapter_key = self._adapter_place(state.request.adapter)
            self.prefill_slot[id(state)] = self._free_slot()
            self.prefilling.append(state)
            self._reuse_prefix(state)
            emit_started(state, out)
            budget -= self._add_chunk(state, budget, chunks, finishing)
            owners.append(state)
        return chunks, owners, finishing

    def _reuse_prefix(self, state: RequestState) -> None:
        """Start the prefill after the longest cached prefix (copied into the slot); not
        for a request scoring its prompt (see the module docstring)."""
        if self._prefix is None:
            return
        if state.request.prompt_logprobs is None:
            state.prefilled = state.cached = self._prefix.restore(
                state.prompt_ids,
                self.prefill_slot[id(state)],
                state.adapter_key,
                fixed=self._fixed(state),
            )
        if self._observer is not None:
            self._observer.on_prefix_cache(len(state.prompt_ids), state.prefilled)

    def _can_admit(self, state: RequestState, holding: dict[str, int]) -> bool:
        if self._one_at_a_time and (self.decoding or self.prefilling):
            return False
        limit = self._max_seqs
        if self.decoding or self.prefilling:  # an idle engine takes anything that fits
            limit -= self.waiting.held_back(state, self._max_seqs, holding)
        return self._reserved() + state.n <= limit

    def _holding(self) -> dict[str, int]:
        """The slots each key's admitted requests hold (``held_back`` keeps the last
        ones from the key with the most while another is about)."""
        holding: dict[str, int] = {}
        for choice in self.decoding:
            name = choice.request.request.tenant.name
            holding[name] = holding.get(name, 0) + 1
        for state in self.prefilling:
            name = state.request.tenant.name
            holding[name] = holding.get(name, 0) + state.n
        return holding

    def _add_chunk(
        self,
        state: RequestState,
        budget: int,
        chunks: list[PrefillChunk],
        finishing: list[RequestState],
    ) -> int:
        start = state.prefilled
        score = state.request.prompt_logprobs is not None
        take = min(len(state.prompt_ids) - start, budget, self._chunk if score else budget)
        done = start + take == len(state.prompt_ids)
        chunks.append(
            PrefillChunk(
                slot=self.prefill_slot[id(state)],
                tokens=tuple(state.prompt_ids[start : start + take]),
                start=start,
                want_logits=done,
                score=score,
                adapter=state.adapter,
                fixed=self._fixed(state),
            )
        )
        state.prefilled += take
        self._in_step.append(state)
        if done:
            finishing.append(state)
        return take

    def _fixed(self, state: RequestState) -> bool:
        """Whether ``state``'s prompt is prefilled in fixed-size calls (the same for all
        its chunks and its prefix-cache blocks)."""
        return self._fixed_prefill is not None and self._fixed_prefill(len(state.prompt_ids))

    def _occupied(self) -> dict[int, RequestState]:
        return {
            slot: s for s in self.prefilling if (slot := self.prefill_slot.get(id(s))) is not None
        }

    def _free_slot(self, avoid: frozenset[int] = frozenset()) -> int:
        # The lowest free slot past the decode region: the cache then only grows as far
        # as the load needs, and a lone prefill usually forks in place (no copy).
        taken = set(self._occupied()) | avoid
        for slot in range(len(self.decoding), self._cache.max_slots):
            if slot not in taken:
                return slot
        raise RuntimeError("no free cache slot")  # admission guarantees one

    def _release_prefill(self, state: RequestState) -> int:
        """The finished prefill's slot, its blocks stored in the prefix cache; the slot
        is free again unless the caller moves the keys on."""
        source = self.prefill_slot.pop(id(state))
        if self._prefix is not None:
            self._prefix.insert(
                state.prompt_ids, source, state.adapter_key, fixed=self._fixed(state)
            )
        return source

    def _end_unsampled(self, state: RequestState, out: StepOutputs) -> None:
        """``max_tokens`` 0: every choice ends at the prompt (``length``), none decodes."""
        self._release_prefill(state)
        for choice in state.choices:
            finish_choice(choice, "length", out)

    def _fork(self, state: RequestState) -> None:
        """Place the request's choices at the end of the decode region, sharing its
        prefilled keys (one copy per extra choice; the prompt is computed once)."""
        source = self._release_prefill(state)
        length = len(state.prompt_ids)
        base = len(self.decoding)
        targets = list(range(base, base + state.n))
        occupied = self._occupied()
        for target in targets:
            other = occupied.get(target)
            if other is not None and other is not state:
                new_slot = self._free_slot(frozenset(targets) | {source})
                self._cache.ensure(new_slot + 1, other.prefilled)
                self._cache.move(target, new_slot, other.prefilled)
                self.prefill_slot[id(other)] = new_slot
        self._cache.ensure(base + state.n, length)
        for target in targets:
            self._cache.move(source, target, length)
        for choice, target in zip(state.choices, targets, strict=True):
            choice.slot = target
            choice.length = length
            self.decoding.append(choice)

    def _compact(self) -> None:
        """Drop finished/aborted choices, keeping ``decoding[i].slot == i``."""
        dec = self.decoding
        i = 0
        while i < len(dec):
            choice = dec[i]
            if choice.finish is None and not choice.request.aborted:
                i += 1
                continue
            last = dec.pop()
            if i < len(dec):
                self._cache.move(last.slot, i, last.length)
                last.slot = i
                dec[i] = last
