"""Per-step thread counts (``StepThreads``)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from backends.hf.loading.load_thread import call_in_own_thread
from backends.hf.model.step_threads import StepThreads, as_step
from config.schema import HFModelConfig


def _on_own_thread(body: Callable[[], None]) -> None:
    # The count is per OpenMP thread: run where it cannot leak into other tests.
    call_in_own_thread(body, "test-threads")


def test_small_steps_run_on_one_thread_large_on_all(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = torch.set_num_threads

    def counting(n: int) -> None:
        calls.append(n)
        real(n)

    monkeypatch.setattr(torch, "set_num_threads", counting)

    def body() -> None:
        threads = StepThreads(2, small_tokens=8)
        seen = []
        for tokens in (1, 8, 9, 300, 64, 3, 2):
            threads.apply(tokens)
            seen.append(torch.get_num_threads())
        assert seen == [1, 1, 2, 2, 2, 1, 1]

    _on_own_thread(body)
    assert calls == [1, 2, 1]  # unchanged counts skip the call


def test_engines_switch_only_when_asked_on_cpu_with_several_threads() -> None:
    default = HFModelConfig(name="m", backend="hf", source="/m")
    assert not default.adaptive_threads  # opt-in: docs/hf.md, "Threads"
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert StepThreads.for_engine(default.adaptive_threads, 2, cpu) is None
    policy = StepThreads.for_engine(True, 2, cpu)
    assert policy is not None and policy.maximum == 2 and policy.small_tokens == 8
    assert StepThreads.for_engine(True, 1, cpu) is None  # nothing to switch between
    assert StepThreads.for_engine(True, 2, cuda) is None  # threads do not run CUDA kernels
    assert StepThreads.for_engine(False, 2, cpu) is None


def test_as_step_sets_the_count_of_such_a_step_then_restores_it() -> None:
    def body() -> None:
        torch.set_num_threads(2)
        policy = StepThreads(2, small_tokens=8)
        with as_step(policy, 8):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2 and policy.current == 0  # the engine's untouched
        with as_step(policy, 9):
            assert torch.get_num_threads() == 2
        with as_step(None, 8):  # no policy: every step on the caller's count
            assert torch.get_num_threads() == 2

    _on_own_thread(body)
