"""Prefix caching with the real SmolLM2 (fp32): greedy outputs equal with the cache off.

Two backends for the module: the cache off (the reference) and on, with a budget small
enough (20 blocks) that two ~150-token system prompts evict each other's blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backends.hf.backend import HFBackend
from tests.hf.helpers import RecordingObserver, collect, completion, config, leave_after

SYSTEM_A = (
    "You are a careful assistant for a public library. You answer questions about opening "
    "hours, borrowing rules, late fees, room bookings and the catalogue. Opening hours are "
    "nine to six on weekdays and ten to four on Saturdays; the library is closed on Sundays "
    "and public holidays. Members may borrow up to twelve items for three weeks and renew "
    "them twice online unless someone else has reserved them. Late fees are twenty cents a "
    "day per item, capped at five euros. Study rooms seat four and can be booked for two "
    "hours at a time. Answer in one short sentence.\n"
)
SYSTEM_B = (
    "You are a terse assistant for a bicycle repair shop. The shop fixes punctures, adjusts "
    "gears and brakes, replaces chains and cables, trues wheels and services suspension "
    "forks. A puncture repair costs eight euros and takes twenty minutes; a full service "
    "costs sixty euros and takes a day. The shop opens at eight and closes at seven, Monday "
    "to Saturday. Customers can book online or walk in; walk-ins are served in order of "
    "arrival. Spare parts are ordered within two days. Answer in one short sentence.\n"
)
QUESTIONS = [
    "Q: When do you open on Saturday?\nA:",
    "Q: How much does it cost?\nA:",
    "Q: Can I come without booking?\nA:",
    "Q: What happens if I am late?\nA:",
]
PROMPTS = [s + q for s in (SYSTEM_A, SYSTEM_B) for q in QUESTIONS]
TOKENS = 8
BUDGET = 320


@pytest.fixture(scope="module")
async def off() -> AsyncIterator[HFBackend]:
    b = HFBackend(config(max_num_seqs=12, prefix_caching=False))
    await b.start()
    yield b
    await b.stop()


@pytest.fixture(scope="module")
def observer() -> RecordingObserver:
    return RecordingObserver()


@pytest.fixture(scope="module")
async def on(observer: RecordingObserver) -> AsyncIterator[HFBackend]:
    b = HFBackend(config(max_num_seqs=12, prefix_cache_tokens=BUDGET), observer)
    await b.start()
    yield b
    await b.stop()


@pytest.fixture(scope="module")
async def reference(off: HFBackend) -> list[str]:
    results = await asyncio.gather(*(collect(off.generate(completion(p, TOKENS))) for p in PROMPTS))
    return [r.text() for r in results]


def hits_since(observer: RecordingObserver, before: int) -> list[int]:
    return [hit for _, hit in observer.prefix[before:]]


async def test_staggered_requests_hit_and_match(
    on: HFBackend, reference: list[str], observer: RecordingObserver
) -> None:
    async def late(i: int) -> str:
        await asyncio.sleep(0.4 * i)
        return (await collect(on.generate(completion(PROMPTS[i], TOKENS)))).text()

    before = len(observer.prefix)
    texts = await asyncio.gather(*(late(i) for i in range(4)))
    assert texts == reference[:4]
    hits = hits_since(observer, before)
    assert len(hits) == 4 and hits[0] == 0
    # the system prompt is ~115 tokens: every later request skipped at least 6 blocks
    assert all(hit >= 96 for hit in hits[1:])
    assert all(hit % 16 == 0 for hit in hits)


async def test_concurrent_mixed_prefixes_with_eviction(
    on: HFBackend, reference: list[str], observer: RecordingObserver
) -> None:
    before = len(observer.prefix)
    for _ in range(2):  # the second round finds blocks of both system prompts
        results = await asyncio.gather(
            *(collect(on.generate(completion(p, TOKENS))) for p in PROMPTS)
        )
        assert [r.text() for r in results] == reference
    assert sum(hits_since(observer, before)) > 0


async def test_repeated_prompt_reuses_all_but_the_last_block(
    on: HFBackend, reference: list[str], observer: RecordingObserver
) -> None:
    for _ in range(2):
        result = await collect(on.generate(completion(PROMPTS[5], TOKENS)))
        assert result.text() == reference[5]
        assert result.usage.prompt_tokens == observer.prefix[-1][0]
        # The hit is what the request reports as cached prompt tokens (priced apart).
        assert result.usage.cached_tokens == observer.prefix[-1][1]
    queried, hit = observer.prefix[-1]
    assert queried - 16 <= hit < queried


async def test_n_choices_from_a_cached_prefix(on: HFBackend, off: HFBackend) -> None:
    greedy = await collect(on.generate(completion(PROMPTS[2], TOKENS, n=2)))
    alone = await collect(off.generate(completion(PROMPTS[2], TOKENS)))
    assert greedy.text(0) == greedy.text(1) == alone.text()
    sampled = completion(PROMPTS[6], TOKENS, n=3, temperature=0.8, seed=11)
    with_cache = await collect(on.generate(sampled))
    without = await collect(off.generate(sampled))
    assert [with_cache.text(i) for i in range(3)] == [without.text(i) for i in range(3)]


async def test_abort_leaves_others_and_the_cache_intact(
    on: HFBackend, reference: list[str], observer: RecordingObserver
) -> None:
    aborts = observer.aborts

    async def stays(i: int) -> str:
        return (await collect(on.generate(completion(PROMPTS[i], TOKENS)))).text()

    results = await asyncio.gather(
        leave_after(on.generate(completion(PROMPTS[0], 100)), 2), stays(1), stays(3), stays(4)
    )
    assert results == [2, reference[1], reference[3], reference[4]]
    after = await asyncio.gather(stays(0), stays(2))
    assert after == [reference[0], reference[2]]
    for _ in range(50):
        if observer.aborts > aborts:
            break
        await asyncio.sleep(0.05)
    assert observer.aborts == aborts + 1
