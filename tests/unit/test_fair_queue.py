"""``FairQueue``: the bounds of its per-tenant state, and its edges (an empty line, an
item that is not waiting, a weight that is not positive)."""

from __future__ import annotations

import pytest

from backends.base import Tenant
from backends.fair_queue import FairQueue


class Item:
    """A waiting thing, told apart by identity."""


def test_idle_tenants_are_forgotten_beyond_the_bound() -> None:
    line: FairQueue[Item] = FairQueue(aging=10.0, max_idle_tenants=4)
    for index in range(100):
        tenant = Tenant(f"key-{index}")
        line.push(Item(), priority=0, tenant=tenant, queued_at=float(index))
        line.pop()
        line.charge(tenant, 5)
        assert line.tenants <= 5  # the bound, plus the one just made
    assert line.tenants == 4
    assert line.counter("key-0") is None and line.counter("key-99") is not None


def test_waiting_tenants_are_never_forgotten() -> None:
    line: FairQueue[Item] = FairQueue(aging=10.0, max_idle_tenants=1)
    for index in range(10):
        line.push(Item(), priority=0, tenant=Tenant(f"key-{index}"), queued_at=float(index))
    assert line.tenants == 10 and len(line) == 10
    assert [line.counter(f"key-{index}") for index in range(10)] == [0.0] * 10
    for _ in range(10):
        line.pop()
    line.push(Item(), priority=0, tenant=Tenant("late"), queued_at=20.0)
    assert line.tenants <= 2


def test_a_forgotten_tenant_comes_back_at_the_others_level() -> None:
    line: FairQueue[Item] = FairQueue(aging=10.0, max_idle_tenants=1)
    busy = Tenant("busy")
    first = Item()
    line.push(first, priority=0, tenant=busy, queued_at=0.0)
    line.push(Item(), priority=0, tenant=busy, queued_at=0.1)
    assert line.pop() is first
    line.charge(busy, 500)
    line.push(Item(), priority=0, tenant=Tenant("new"), queued_at=1.0)
    assert line.counter("new") == line.counter("busy") == 500  # lifted: no banked credit


def test_edges() -> None:
    line: FairQueue[Item] = FairQueue(aging=10.0)
    with pytest.raises(IndexError):
        line.peek()
    with pytest.raises(IndexError):
        line.pop()
    with pytest.raises(ValueError):
        line.remove(Item())
    item = Item()
    line.push(item, priority=3, tenant=Tenant(), queued_at=0.0)
    assert item in line and Item() not in line and line
    line.remove(item)
    assert not line and len(line) == 0
    with pytest.raises(ValueError):
        Tenant("x", weight=0)
    with pytest.raises(ValueError):
        FairQueue(aging=1.0, max_idle_tenants=0)
