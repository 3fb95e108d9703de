"""The hf scheduler's waiting queue: priority first, then arrival, aging so low never
starves, weighted fair share between keys within a priority, and low priority shed
first when the queue fills; and the continuous scheduler admits from it in that order
(a key's burst does not hold back another key's request)."""

from __future__ import annotations

from dataclasses import replace

from backends.base import Tenant
from backends.hf.engine.outputs import StepOutputs
from backends.hf.engine.scheduler import ContinuousScheduler
from backends.hf.engine.sequence import RequestState
from backends.hf.engine.waiting import AGING, WaitingQueue, shed_limit
from tests.unit.test_hf_scheduler import FakeRunner, _scheduler, _state


def state(
    priority: int,
    queued_at: float,
    prompt: list[int] | None = None,
    max_tokens: int = 2,
    key: str = "",
) -> RequestState:
    made = _state(prompt or [3, 4], max_tokens)
    made.request = replace(made.request, priority=priority, tenant=Tenant(key))
    made.queued_at = queued_at
    return made


def drain(queue: WaitingQueue) -> list[RequestState]:
    return [queue.popleft() for _ in range(len(queue))]


def test_priority_first_then_arrival() -> None:
    queue = WaitingQueue()
    low, normal, high, normal_later = state(1, 0.0), state(0, 0.1), state(-1, 0.2), state(0, 0.3)
    for item in (low, normal, high, normal_later):
        queue.append(item)
    assert queue.peek() is high and len(queue) == 4 and normal in queue
    assert {id(item) for item in queue} == {id(low), id(normal), id(high), id(normal_later)}
    queue.remove(normal)
    assert normal not in queue
    assert drain(queue) == [high, normal_later, low]
    assert not queue


def test_aging_bounds_how_long_low_waits() -> None:
    queue = WaitingQueue()
    low = state(1, 0.0)
    queue.append(low)
    queue.append(state(0, AGING - 0.5))  # arrived within one step of aging: goes first
    queue.append(state(-1, 2 * AGING + 0.5))  # arrived after two steps: low goes first
    assert drain(queue).index(low) == 1


def test_aging_holds_with_several_keys() -> None:
    queue = WaitingQueue()
    low = state(1, 0.0, key="a")
    queue.append(low)
    for index in range(5):  # another key's normal burst, all after low has aged a step
        queue.append(state(0, AGING + 1 + index, key="b"))
    assert queue.peek() is low


def test_one_keys_burst_does_not_hold_back_another_key() -> None:
    queue = WaitingQueue()
    burst = [state(0, 0.01 * i, key="a") for i in range(20)]
    for item in burst:
        queue.append(item)
    first = queue.popleft()
    queue.charge(Tenant("a"), 50)  # the engine computes a's request
    late = state(0, 1.0, key="b")
    queue.append(late)
    assert first is burst[0]
    assert queue.popleft() is late  # before a's second, not after its twentieth
    assert drain(queue) == burst[1:]  # a's own requests stay in arrival order


def test_keys_alternate_at_equal_work_and_high_still_goes_first() -> None:
    queue = WaitingQueue()
    a = [state(0, 0.1 * i, key="a") for i in range(3)]
    b = [state(0, 1.0 + 0.1 * i, key="b") for i in range(3)]
    high = state(-1, 5.0, key="b")
    for item in (*a, *b, high):
        queue.append(item)
    order = drain(queue)  # nothing charged: equal work, so the least recently served
    assert order == [high, a[0], b[0], a[1], b[1], a[2], b[2]]


def test_weights_share_the_picks_in_proportion() -> None:
    queue = WaitingQueue()
    light, heavy = Tenant("light", 1.0), Tenant("heavy", 3.0)
    counts = {"light": 0, "heavy": 0}
    for index in range(200):
        for tenant in (light, heavy):
            item = state(0, index * 0.01, key=tenant.name)
            item.request = replace(item.request, tenant=tenant)
            queue.append(item)
    for _ in range(200):
        picked = queue.popleft().request.tenant
        counts[picked.name] += 1
        queue.charge(picked, 10)  # equal requests: 10 tokens each
    assert counts == {"light": 50, "heavy": 150}


def test_an_idle_key_banks_no_credit() -> None:
    queue = WaitingQueue()
    queue.append(state(0, 0.0, key="a"))
    queue.popleft()
    queue.charge(Tenant("a"), 1000)  # a ran alone for a while: b was idle, not starved
    for index in range(4):
        queue.append(state(0, 1.0 + index, key="a"))
        queue.append(state(0, 1.0 + index, key="b"))
    order = []
    for _ in range(4):
        picked = queue.popleft()
        order.append(picked.request.tenant.name)
        queue.charge(picked.request.tenant, 10)
    assert order == ["b", "a", "b", "a"]  # shares from here on; b does not get 1000 first


def test_low_priority_is_shed_first() -> None:
    assert shed_limit(100, 1) == 50
    assert shed_limit(100, 0) == 100  # normal keeps the queue it always had
    assert shed_limit(100, -1) == 100
    assert shed_limit(1, 1) == 1  # never zero: an idle model serves every priority


def test_continuous_scheduler_admits_another_keys_request_before_the_burst() -> None:
    """Key a keeps 16 of 16 slots busy and 16 more waiting; key b's request arrives and
    takes the first slot that frees, before a's 17th. With one key (first come, first
    served) it would wait for all sixteen. (A chunk as large as the budget: the burst
    is admitted in one step, which is not what this test is about.)"""
    for b_key, slot_of_b in (("b", 0), ("a", 16)):
        sched = _scheduler(16, 4096, prefill_chunk=4096)
        out: StepOutputs = []
        burst = [state(0, 0.01 * i, [3, 4], max_tokens=4 + i, key="a") for i in range(32)]
        for item in burst:
            sched.add(item, out)
        sched.step(out)
        assert len(sched.prefilling) + len(sched.decoding) == 16
        late = state(0, 1.0, [5, 6], max_tokens=4, key=b_key)
        sched.add(late, out)
        admitted: list[RequestState] = []
        while late not in admitted:
            running = {id(s) for s in (*sched.prefilling, *(c.request for c in sched.decoding))}
            sched.step(out)
            now = [*sched.prefilling, *(c.request for c in sched.decoding)]
            admitted.extend(s for s in now if id(s) not in running and s not in admitted)
        assert admitted.index(late) == slot_of_b


def test_the_key_holding_most_slots_leaves_one_free_while_another_key_is_about() -> None:
    """Key b was seen a moment ago; key a's burst then takes 7 of 8 slots, not 8, so b's
    next request starts at once instead of waiting for one of a's long answers."""
    sched = _scheduler(8, 4096, prefill_chunk=4096)
    out: StepOutputs = []
    first_b = state(0, 0.0, [5, 6], max_tokens=1, key="b")
    sched.add(first_b, out)
    sched.step(out)
    assert not sched.has_work()  # b's first request came and went
    for index in range(16):
        sched.add(state(0, 1.0 + 0.01 * index, [3, 4], max_tokens=40, key="a"), out)
    sched.step(out)
    sched.step(out)
    assert len(sched.decoding) == 7 and len(sched.waiting) == 9
    late = state(0, 2.0, [5, 6], max_tokens=4, key="b")
    sched.add(late, out)
    sched.step(out)
    assert late in [choice.request for choice in sched.decoding]
    one_key = _scheduler(8, 4096, prefill_chunk=4096)  # a alone: every slot is a's
    for index in range(16):
        one_key.add(state(0, 1.0 + 0.01 * index, [3, 4], max_tokens=40, key="a"), out)
    one_key.step(out)
    one_key.step(out)
    assert len(one_key.decoding) == 8


def test_continuous_scheduler_admits_high_first() -> None:
    sched = _scheduler(1, 64)
    out: StepOutputs = []
    low, high = state(1, 0.0, [5, 6]), state(-1, 1.0, [7, 8])
    sched.add(low, out)
    sched.add(high, out)
    sched.step(out)
    assert sched.prefilling + [c.request for c in sched.decoding] == [high]
    assert list(sched.waiting) == [low]
    assert sched.waiting.peek() is low


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


def recording(max_seqs: int, newcomer_steps: bool = True) -> tuple[ContinuousScheduler, FakeRunner]:
    """A scheduler over a fake runner that keeps its calls (``FakeRunner.calls``)."""
    runner = FakeRunner(max_seqs + 1)
    return _scheduler(max_seqs, 4096, runner=runner, newcomer_steps=newcomer_steps), runner


def busy_with(sched: ContinuousScheduler, key: str, streams: int) -> StepOutputs:
    """``streams`` long requests of ``key``, stepped until all of them decode."""
    out: StepOutputs = []
    for index in range(streams):
        sched.add(state(0, 0.01 * index, [3, 4], max_tokens=60, key=key), out)
    while len(sched.decoding) < streams:
        sched.step(out)
    return out


def test_a_newcomer_keys_request_is_prefilled_in_a_step_of_its_own() -> None:
    """Key a decodes 16 rows (at least max_num_seqs // 8 of 32); key b, holding nothing,
    sends a request: the next step prefills b's prompt alone and a's rows sit it out, the
    step after decodes all 17 (with b's second request, as b now holds a slot). A
    request of a's own, b beside a key holding fewer slots than that, or b with
    ``newcomer_steps`` off, joins the decode rows' step as before."""
    sched, runner = recording(32)
    out = busy_with(sched, "a", 16)
    late, second = (state(0, 1.0, [5, 6, t], max_tokens=4, key="b") for t in (7, 8))
    sched.add(late, out)
    sched.add(second, out)
    sched.step(out)
    rows, chunks = runner.calls[-1]
    assert rows == 0 and [c.tokens for c in chunks] == [(5, 6, 7)]  # one request a key
    assert late in [choice.request for choice in sched.decoding]
    sched.step(out)
    rows, chunks = runner.calls[-1]
    assert rows == 17 and [c.tokens for c in chunks] == [(5, 6, 8)]
    for key, streams, on in (("a", 16, True), ("b", 3, True), ("b", 16, False)):
        mixed, mixed_runner = recording(32, newcomer_steps=on)
        out = busy_with(mixed, "a", streams)
        mixed.add(state(0, 1.0, [5, 6, 7], max_tokens=4, key=key), out)
        mixed.step(out)
        rows, chunks = mixed_runner.calls[-1]
        assert rows == streams and [c.tokens for c in chunks] == [(5, 6, 7)]


def test_decode_rows_advance_at_least_every_other_step_under_newcomers() -> None:
    """Two new keys' requests every step: the steps alternate, newcomer step and decode
    step (which admits the requests that came meanwhile), and a's streams lose no
    token."""
    sched, runner = recording(32)
    out = busy_with(sched, "a", 8)
    first = len(runner.calls)
    lengths = [choice.length for choice in sched.decoding]
    for index in range(8):
        for key in (f"n{index}", f"m{index}"):
            sched.add(state(0, 2.0 + index, [9, 9], max_tokens=1, key=key), out)
        sched.step(out)
    calls = runner.calls[first:]
    assert [rows == 0 for rows, _ in calls] == [True, False] * 4
    for rows, chunks in calls:
        if rows == 0:
            assert [c.tokens for c in chunks] == [(9, 9), (9, 9)]
    assert [choice.length for choice in sched.decoding[:8]] == [n + 4 for n in lengths]
