"""The prefix cache on a small synthetic slot cache: chained matching, copies, LRU."""

from __future__ import annotations

import torch
from prometheus_client import CollectorRegistry

from backends.hf.model.kv_cache import SlotKVCache
from backends.hf.model.prefix_cache import PrefixCache
from backends.hop_metrics import BackendMetrics

BS = 4


def slot_cache() -> SlotKVCache:
    cache = SlotKVCache(
        layers=2,
        kv_heads=2,
        head_dim=3,
        max_slots=4,
        max_capacity=64,
        dtype=torch.float32,
        device=torch.device("cpu"),
        initial_slots=4,
        initial_capacity=64,
    )
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    return cache


def test_hit_copies_exactly_the_cached_positions() -> None:
    cache = slot_cache()
    prefix = PrefixCache(cache, max_tokens=64, block_size=BS)
    prompt = list(range(100, 111))  # 11 tokens: 2 full blocks
    prefix.insert(prompt, slot=0)
    assert prefix.cached_blocks == 2
    matched = prefix.restore([*prompt[:9], 7, 7], slot=2)
    assert matched == 8
    assert torch.equal(cache.k[:, 2, :, :8], cache.k[:, 0, :, :8])
    assert torch.equal(cache.v[:, 2, :, :8], cache.v[:, 0, :, :8])
    assert (prefix.stats.queried, prefix.stats.hit) == (11, 8)


def test_prompts_in_fixed_size_calls_and_adapters_keep_their_own_blocks() -> None:
    cache = slot_cache()
    prefix = PrefixCache(cache, max_tokens=64, block_size=BS)
    prompt = list(range(100, 111))
    prefix.insert(prompt, slot=0, fixed=True)  # rounded in other calls than rows alone
    assert prefix.restore(prompt, slot=2) == 0
    assert prefix.restore(prompt, slot=2, adapter=0, fixed=True) == 0
    assert prefix.restore(prompt, slot=2, fixed=True) == 8
    prefix.insert(prompt, slot=1, adapter=0)
    assert prefix.restore(prompt, slot=2, adapter=0) == 8
    assert prefix.cached_blocks == 4


def test_the_last_prompt_token_is_always_computed() -> None:
    cache = slot_cache()
    prefix = PrefixCache(cache, max_tokens=64, block_size=BS)
    prompt = list(range(8))
    prefix.insert(prompt, slot=0)
    assert prefix.cached_blocks == 2
    assert prefix.restore(prompt, slot=1) == 4  # not 8: the logits need token 7
    assert prefix.restore([*prompt, 9], slot=1) == 8


def test_a_block_matches_only_after_the_same_prefix() -> None:
    cache = slot_cache()
    prefix = PrefixCache(cache, max_tokens=64, block_size=BS)
    prefix.insert([1, 2, 3, 4, 5, 6, 7, 8, 0], slot=0)
    # the second block's tokens alone, after another first block: no match
    assert prefix.restore([9, 9, 9, 9, 5, 6, 7, 8, 0], slot=1) == 0
    assert prefix.restore([1, 2, 3, 4, 9, 9, 9, 9, 0], slot=1) == 4


def test_lru_evicts_leaves_first_within_the_budget() -> None:
    cache = slot_cache()
    prefix = PrefixCache(cache, max_tokens=3 * BS, block_size=BS, initial_blocks=1)
    a = [1, 1, 1, 1, 2, 2, 2, 2, 0]
    b = [1, 1, 1, 1, 3, 3, 3, 3, 0]
    prefix.insert(a, slot=0)
    prefix.insert(b, slot=1)
    assert prefix.cached_blocks == 3  # the shared first block is stored once
    prefix.restore(a, slot=2)  # a's leaf is now newer than b's
    c = [4, 4, 4, 4, 0]
    prefix.insert(c, slot=3)
    assert prefix.cached_blocks == 3
    assert prefix.restore(b, slot=2) == 4  # b's leaf went; the shared root stayed
    assert prefix.restore(a, slot=2) == 8
    assert prefix.restore(c, slot=2) == 4
    assert prefix.stats.evicted_blocks == 1
    assert prefix.nbytes == 2 * 2 * 3 * 2 * BS * 3 * 4


def test_restored_keys_survive_later_writes_to_the_source_slot() -> None:
    cache = slot_cache()
    prefix = PrefixCache(cache, max_tokens=64, block_size=BS)
    prompt = list(range(10))
    prefix.insert(prompt, slot=0)
    expected = cache.k[:, 0, :, :8].clone()
    cache.k[:, 0].zero_()  # the slot is reused by another sequence
    assert prefix.restore(prompt, slot=3) == 8
    assert torch.equal(cache.k[:, 3, :, :8], expected)


def test_hit_ratio_gauge() -> None:
    registry = CollectorRegistry()
    observer = BackendMetrics(registry).observer("m")
    observer.on_prefix_cache(100, 0)
    observer.on_prefix_cache(100, 96)
    labels = {"model": "m"}
    assert registry.get_sample_value("llmso_worker_prefix_cache_hit_ratio", labels) == 0.48
    total = "llmso_worker_prefix_cache_hit_tokens_total"
    assert registry.get_sample_value(total, labels) == 96
