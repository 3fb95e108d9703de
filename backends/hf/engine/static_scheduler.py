"""Static batching with transformers' own forward: collect, pad left, run to completion.

Up to ``max_batch_size`` requests that arrive within ``batch_window_ms`` of the first
one form a batch (each choice is a row). Prompts are padded on the LEFT so every row's
next token sits in the last column; the attention mask hides the padding and the
position ids count only real tokens (``cumsum(mask) - 1``): without explicit position
ids a padded row would see its prompt at shifted RoPE positions and decode differently
from the same prompt alone. The batch decodes step by step (events stream every step,
aborts apply between steps) until every row has finished; nothing joins meanwhile.

This path works for any ``AutoModelForCausalLM``; it runs only when ``scheduling: static``
is configured (a model type the packed ``DecoderRunner`` does not cover falls back to the
``ModuleRunner``, not here). Owner: the engine thread.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import torch

from backends.hf.engine.detokenizer import TokenTable
from backends.hf.engine.outputs import StepOutputs, accept_token, emit_started
from backends.hf.engine.sampler import sample
from backends.hf.engine.sequence import Choice, RequestState
from backends.hop_metrics import WorkerObserver

if TYPE_CHECKING:
    from transformers import DynamicCache


class StaticScheduler:
    """See the module docstring."""

    def __init__(
        self,
        model: Any,
        table: TokenTable,
        *,
        pad_id: int,
        max_batch_size: int,
        batch_window_s: float,
        observer: WorkerObserver | None,
    ) -> None:
        self._model = model
        self._table = table
        self._pad = pad_id
        self._max_batch = max_batch_size
        self._window = batch_window_s
        self._observer = observer
        self._device = next(model.parameters()).device
        self.waiting: deque[RequestState] = deque()
        self._first_wait = 0.0
        self._rows: list[Choice] = []
        self._cache: DynamicCache | None = None
        self._mask: torch.Tensor | None = None
        self._positions: torch.Tensor | None = None
        self._keep_last = True

    def add(self, state: RequestState, out: StepOutputs) -> None:
        if not self.waiting:
            self._first_wait = time.monotonic()
        self.waiting.append(state)

    def abort(self, state: RequestState) -> None:
        if state in self.waiting:
            self.waiting.remove(state)
        # rows of a running batch are skipped; the batch ends when all rows are done

    def has_work(self) -> bool:
        return bool(self.waiting or self._rows)

    def wait_hint(self) -> float | None:
        if self._rows or not self.waiting or self._batch_rows() >= self._max_batch:
            return None
        left = self._window - (time.monotonic() - self._first_wait)
        return left if left > 0 else None

    def open_requests(self) -> list[RequestState]:
        seen = {id(c.request): c.request for c in self._rows}
        seen.update({id(s): s for s in self.waiting})
        return [s for s in seen.values() if not s.done and not s.aborted]

    def kv_usage(self) -> float:
        return 0.0

    def fail_step(self) -> list[RequestState]:
        """See ``StepPolicy.fail_step``: the running batch is one forward, so all of it
        leaves; requests still waiting for the next batch stay."""
        failed = {id(c.request): c.request for c in self._rows}
        self._rows, self._cache, self._mask, self._positions = [], None, None, None
        return list(failed.values())

    def _batch_rows(self) -> int:
        return sum(s.n for s in self.waiting)

    def step(self, out: StepOutputs) -> None:
        began = time.perf_counter()
        if not self._rows:
            if self.wait_hint() is not None:
                return
            tokens = self._prefill(out)
        else:
            tokens = self._decode(out)
        if self._observer is not None:
            self._observer.on_step(len(self._rows), tokens, time.perf_counter() - began)
        if all(c.finish is not None or c.request.aborted for c in self._rows):
            self._rows, self._cache, self._mask, self._positions = [], None, None, None
        self.report_load()

    def report_load(self) -> None:
        if self._observer is not None:
            running = {
                id(c.request) for c in self._rows if c.finish is None and not c.request.aborted
            }
            self._observer.on_load(len(running), len(self.waiting), 0.0)

    def _prefill(self, out: StepOutputs) -> int:
        batch: list[RequestState] = []
        rows = 0
        while self.waiting and (not batch or rows + self.waiting[0].n <= self._max_batch):
            state = self.waiting.popleft()
            batch.append(state)
            rows += state.n
            emit_started(state, out)
        if self.waiting:
            self._first_wait = time.monotonic()
        self._rows = [c for s in batch for c in s.choices]
        width = max(len(s.prompt_ids) for s in batch)
        ids = torch.full((len(self._rows), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(self._rows), width), dtype=torch.long)
        for row, choice in enumerate(self._rows):
            prompt = choice.request.prompt_ids
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        mask = mask.to(self._device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        # Imported here, not at module level: transformers' first import belongs under
        # the load lock (backends/process_wide.py); by now the load has imported it.
        from transformers import DynamicCache

        self._cache = DynamicCache()
        logits = self._forward(ids.to(self._device), mask, positions)
        self._mask, self._positions = mask, positions[:, -1:]
        self._accept(logits, out)
        return int(mask.sum())

    def _decode(self, out: StepOutputs) -> int:
        assert self._mask is not None and self._positions is not None
        ids = torch.tensor(
            [[c.output_ids[-1]] for c in self._rows], dtype=torch.long, device=self._device
        )
        ones = torch.ones((len(self._rows), 1), dtype=self._mask.dtype, device=self._device)
        self._mask = torch.cat((self._mask, ones), dim=1)
        self._positions = self._positions + 1
        logits = self._forward(ids, self._mask, self._positions)
        self._accept(logits, out)
        return len(self._rows)

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": mask,
            "position_ids": positions,
            "past_key_values": self._cache,
            "use_cache": True,
        }
        if self._keep_last:
            try:  # only the last position's logits: saves a vocab-sized matmul per token
                result = self._model(**kwargs, logits_to_keep=1)
            except TypeError:  # an architecture without that argument
                self._keep_last = False
        if not self._keep_last:
            result = self._model(**kwargs)
        logits: torch.Tensor = result.logits[:, -1, :]
        return logits.float()

    def _accept(self, logits: torch.Tensor, out: StepOutputs) -> None:
        live = [i for i, c in enumerate(self._rows) if c.finish is None and not c.request.aborted]
        if not live:
            return
        choices = [self._rows[i] for i in live]
        picked = logits.index_select(0, torch.tensor(live, device=logits.device))
        for choice, (token, logprob) in zip(
            choices, sample(picked, choices, self._table), strict=True
        ):
            accept_token(choice, token, logprob, out)
