"""The torch intra-op thread count of each engine step on CPU.

Why per step: the engine's OpenMP team shares the process, and usually the cores, with
the gateway's event loop. A small step (a few decode rows) gains little from a second
thread but keeps it busy at every barrier, taking the core the loop needs to stream
tokens; a large step is matmul-bound and gains from every core. So a step of at most
``small_tokens`` packed tokens runs on one thread, a larger one on ``maximum``
(measurements: docs/hf_profile.md, "Threads and the OpenMP wait policy" and
"Thread switching"; config field ``adaptive_threads``, opt-in: since the model loads on
a thread that exits, two threads win at small steps too, docs/hf.md "Threads").

Owner: the engine thread (``torch.set_num_threads`` sets the calling thread's OpenMP
team size, so it must run on the thread that steps the model). Not thread-safe.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

# Steps of up to this many packed tokens run on one thread. Measured on the 2-vCPU AMD
# EPYC, load ~3, passive OpenMP waiting (docs/hf_profile.md): one thread was 0.86-0.94x
# of two's step time at 1-8 decode rows, 1.04x at 12, 1.10x at 16, 1.24x at 32.
SMALL_STEP_TOKENS = 8


class StepThreads:
    """Switches the calling thread's team between 1 and ``maximum`` threads per step;
    ``set_num_threads`` is called only when the count changes."""

    def __init__(self, maximum: int, small_tokens: int = SMALL_STEP_TOKENS) -> None:
        self.maximum = maximum
        self.small_tokens = small_tokens
        self.current = 0  # unknown until the first step sets it

    @classmethod
    def for_engine(cls, adaptive: bool, threads: int, device: torch.device) -> StepThreads | None:
        """The policy of an engine stepping on ``device`` with ``threads`` threads, or None
        (every step on ``threads``): switching only matters on CPU with more than one."""
        if not adaptive or device.type != "cpu" or threads < 2:
            return None
        return cls(threads)

    def for_tokens(self, tokens: int) -> int:
        return 1 if tokens <= self.small_tokens else self.maximum

    def apply(self, tokens: int) -> int:
        wanted = self.for_tokens(tokens)
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted
        return wanted


@contextlib.contextmanager
def as_step(policy: StepThreads | None, tokens: int) -> Iterator[None]:
    """The calling thread runs on the count ``policy`` gives a step of ``tokens``, then on
    its own again: load-time kernel timing and warm-up then match how those steps run (an
    inductor kernel bakes the thread count it was compiled with). Leaves
    ``policy.current`` alone (it tracks the engine thread, not this one)."""
    if policy is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(policy.for_tokens(tokens))
    try:
        yield
    finally:
        torch.set_num_threads(before)
