"""The hf scheduler's waiting queue: priority first, then arrival, aging so low never
starves, and low priority shed first when the queue fills; and the continuous scheduler
admits from it in that order."""

from __future__ import annotations

from dataclasses import replace

from backends.hf.engine.outputs import StepOutputs
from backends.hf.engine.sequence import RequestState
from backends.hf.engine.waiting import AGING, WaitingQueue, shed_limit
from tests.unit.test_hf_scheduler import _scheduler, _state


def state(
    priority: int, queued_at: float, prompt: list[int] | None = None, max_tokens: int = 2
) -> RequestState:
    made = _state(prompt or [3, 4], max_tokens)
    made.request = replace(made.request, priority=priority)
    made.queued_at = queued_at
    return made


def test_priority_first_then_arrival() -> None:
    queue = WaitingQueue()
    low, normal, high, normal_later = state(1, 0.0), state(0, 0.1), state(-1, 0.2), state(0, 0.3)
    for item in (low, normal, high, normal_later):
        queue.append(item)
    assert list(queue) == [high, normal, normal_later, low]
    assert queue[0] is high and len(queue) == 4 and normal in queue
    queue.remove(normal)
    assert [queue.popleft() for _ in range(len(queue))] == [high, normal_later, low]
    assert not queue


def test_aging_bounds_how_long_low_waits() -> None:
    queue = WaitingQueue()
    low = state(1, 0.0)
    queue.append(low)
    queue.append(state(0, AGING - 0.5))  # arrived within one step of aging: goes first
    queue.append(state(-1, 2 * AGING + 0.5))  # arrived after two steps: low goes first
    order = list(queue)
    assert order.index(low) == 1


def test_low_priority_is_shed_first() -> None:
    assert shed_limit(100, 1) == 50
    assert shed_limit(100, 0) == 100  # normal keeps the queue it always had
    assert shed_limit(100, -1) == 100
    assert shed_limit(1, 1) == 1  # never zero: an idle model serves every priority


def test_continuous_scheduler_admits_high_first() -> None:
    sched = _scheduler(1, 64)
    out: StepOutputs = []
    low, high = state(1, 0.0, [5, 6]), state(-1, 1.0, [7, 8])
    sched.add(low, out)
    sched.add(high, out)
    sched.step(out)
    assert sched.prefilling + [c.request for c in sched.decoding] == [high]
    assert list(sched.waiting) == [low]


def test_a_slot_is_held_back_for_high_priority_while_it_is_about() -> None:
    sched = _scheduler(2, 64)
    out: StepOutputs = []
    first, second = state(1, 0.0, [5, 6]), state(1, 0.1, [7, 8])
    sched.add(first, out)
    sched.add(second, out)
    sched.step(out)
    assert len(sched.decoding) == 2  # no high traffic yet: every slot serves low
    held = _scheduler(2, 64)
    held.add(state(-1, 0.0, [9], max_tokens=1), out)  # a high request comes and goes
    held.step(out)
    assert not held.has_work()
    for item in (state(1, 1.0, [5, 6], 20), state(1, 1.1, [7, 8], 20), state(1, 1.2, [3], 20)):
        held.add(item, out)
    held.step(out)
    assert len(held.decoding) == 1  # the first low one on an idle engine
    held.step(out)
    assert len(held.decoding) == 1 and len(held.waiting) == 2  # one slot kept for high
    high = state(-1, 2.0, [4, 4], 20)
    held.add(high, out)
    held.step(out)
    assert high in [choice.request for choice in held.decoding]
