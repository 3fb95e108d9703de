"""The relay's ``SlotGate``: beyond ``max_concurrency`` requests wait, and a freed slot
goes by priority, then by fair share between client keys (weighted), never to one key's
whole burst first; the wait stays bounded (``max_queue``, ``queue_timeout``) and a waiter
that gives up hands a slot granted to it on."""

from __future__ import annotations

import asyncio

import pytest

from backends.base import Overloaded, Tenant
from backends.openai_proxy.slots import SlotGate
from config.schema import OpenAIModelConfig


def gate(slots: int = 1, **fields: object) -> SlotGate:
    config = OpenAIModelConfig.model_validate(
        {
            "name": "m",
            "backend": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "max_concurrency": slots,
            **fields,
        }
    )
    return SlotGate(config)


async def queue_up(
    slots: SlotGate, order: list[str], label: str, tenant: Tenant, priority: int = 0
) -> asyncio.Task[None]:
    async def wait() -> None:
        await slots.take(priority, tenant)
        order.append(label)

    task = asyncio.create_task(wait())
    await asyncio.sleep(0)  # in the line, in this order
    return task


async def grant_all(slots: SlotGate, tasks: list[asyncio.Task[None]]) -> None:
    for _ in tasks:
        slots.free()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)


async def test_a_key_burst_does_not_hold_back_another_key() -> None:
    slots = gate()
    a, b = Tenant("a"), Tenant("b")
    await slots.take(0, a)  # a holds the one slot
    order: list[str] = []
    tasks = [await queue_up(slots, order, f"a{i}", a) for i in range(5)]
    tasks.append(await queue_up(slots, order, "b", b))
    await grant_all(slots, tasks)
    assert order.index("b") == 0  # FIFO would have made it wait for all five
    assert [label for label in order if label != "b"] == [f"a{i}" for i in range(5)]


async def test_priority_first_then_fair_share() -> None:
    slots = gate()
    await slots.take()
    order: list[str] = []
    tasks = [
        await queue_up(slots, order, "low", Tenant("a"), 1),
        await queue_up(slots, order, "normal", Tenant("a"), 0),
        await queue_up(slots, order, "high", Tenant("b"), -1),
    ]
    await grant_all(slots, tasks)
    assert order == ["high", "normal", "low"]


async def test_weights_share_the_slots_in_proportion() -> None:
    slots = gate()
    light, heavy = Tenant("light", 1.0), Tenant("heavy", 2.0)
    await slots.take(0, light)
    order: list[str] = []
    tasks = []
    for _ in range(60):
        tasks.append(await queue_up(slots, order, "light", light))
        tasks.append(await queue_up(slots, order, "heavy", heavy))
    for _ in range(60):
        slots.free()
        await asyncio.sleep(0)
    assert len(order) == 60
    assert order.count("heavy") == 40  # two of every three grants
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_the_wait_is_bounded() -> None:
    slots = gate(queue_timeout=0.05, max_queue=1)
    await slots.take()
    waiting = asyncio.create_task(slots.take())
    await asyncio.sleep(0)
    with pytest.raises(Overloaded, match="too many waiting"):
        await slots.take()
    with pytest.raises(Overloaded, match="no free upstream slot"):
        await waiting
    slots.free()
    await asyncio.wait_for(slots.take(), 1.0)  # the slot is free again, nobody waits


async def test_a_waiter_cancelled_as_it_is_granted_passes_the_slot_on() -> None:
    slots = gate()
    await slots.take()
    first = asyncio.create_task(slots.take(0, Tenant("a")))
    await asyncio.sleep(0)
    second = asyncio.create_task(slots.take(0, Tenant("b")))
    await asyncio.sleep(0)
    slots.free()  # granted to the first...
    first.cancel()  # ...which gives up before it runs again
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1.0)  # the slot went on to the second


async def test_no_limit_no_line() -> None:
    config = OpenAIModelConfig.model_validate(
        {"name": "m", "backend": "openai", "base_url": "http://127.0.0.1:9/v1"}
    )
    slots = SlotGate(config)
    for _ in range(100):
        await slots.take()
    assert not config.waits_for_slots  # nothing to wait for: no limit
    limited = config.model_copy(update={"max_concurrency": 2})
    assert limited.waits_for_slots
    assert not limited.model_copy(update={"queue_timeout": 0.0}).waits_for_slots
