"""LanguageKVCache bookkeeping and buffer writes, with small dims and no model."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from oxygen_ros.engine import kv_cache as kv_cache_module
from oxygen_ros.engine.config import CacheConfig
from oxygen_ros.engine.kv_cache import Fit, KVCacheLayout, LanguageKVCache

# L=2 layers, P=2 prefixes, B=3 slots, S=4, T=6, K=1, H=2.
LAYOUT = KVCacheLayout(
    num_slots=3,
    num_prefixes=2,
    prefix_len=4,
    max_seq_len=6,
    num_layers=2,
    num_kv_heads=1,
    head_dim=2,
    dtype="float32",
)


def make_cache(layout: KVCacheLayout = LAYOUT) -> LanguageKVCache:
    return LanguageKVCache(layout)


def prefix_kv(value: float, layout: KVCacheLayout = LAYOUT) -> jnp.ndarray:
    shape = (layout.num_layers, layout.prefix_len, layout.num_kv_heads, layout.head_dim)
    return jnp.full(shape, value, jnp.float32)


def tail_kv(values: list[float], tail_len: int, layout: KVCacheLayout = LAYOUT) -> jnp.ndarray:
    """`[L, N, tail_len, K, H]` whose row n is filled with values[n]."""
    rows = [
        np.full((layout.num_layers, tail_len, layout.num_kv_heads, layout.head_dim), value)
        for value in values
    ]
    return jnp.asarray(np.stack(rows, axis=1), jnp.float32)


def test_buffers_have_fixed_shapes_and_bytes() -> None:
    cache = make_cache()
    assert cache.prefix_k.shape == (2, 2, 4, 1, 2)
    assert cache.prefix_v.shape == (2, 2, 4, 1, 2)
    assert cache.prefix_mask.shape == (2, 4)
    assert cache.gen_k.shape == (2, 3, 6, 1, 2)
    # prefix row: 2 * (2*4*1*2) floats * 4 bytes + 4 mask bytes; slot: 2 * (2*6*1*2) * 4.
    assert LAYOUT.prefix_row_bytes == 132
    assert LAYOUT.slot_bytes == 192
    assert cache.total_bytes == 2 * 132 + 3 * 192
    assert cache.total_bytes == sum(
        buffer.nbytes
        for buffer in (
            cache.prefix_k,
            cache.prefix_v,
            cache.prefix_mask,
            cache.gen_k,
            cache.gen_v,
        )
    )
    assert cache.used_bytes == 0


def test_layout_from_config() -> None:
    layout = KVCacheLayout.from_config(
        CacheConfig(num_slots=5, num_prefixes=3, max_seq_len=40),
        prefix_len=16,
        num_layers=2,
        num_kv_heads=1,
        head_dim=8,
        dtype="bfloat16",
    )
    assert (layout.num_slots, layout.num_prefixes, layout.max_seq_len) == (5, 3, 40)
    assert layout.itemsize == 2
    with pytest.raises(ValueError, match="num_slots"):
        KVCacheLayout(0, 1, 1, 1, 1, 1, 1)


def test_can_admit_answers_in_order_too_long_prefix_slot() -> None:
    cache = make_cache()
    assert cache.can_admit(3, needs_new_prefix=True, seq_len=6) is Fit.OK
    assert cache.can_admit(1, needs_new_prefix=True, seq_len=7) is Fit.TOO_LONG
    assert cache.can_admit(4, needs_new_prefix=True) is Fit.NO_SLOT
    cache.allocate_slot(cache.reserve_prefix(), "a")
    cache.allocate_slot(cache.reserve_prefix(), "b")
    assert cache.can_admit(1, needs_new_prefix=True) is Fit.NO_PREFIX
    assert cache.can_admit(1, needs_new_prefix=False) is Fit.OK
    assert cache.can_admit(2, needs_new_prefix=False) is Fit.NO_SLOT
    assert cache.can_admit(0, needs_new_prefix=True) is Fit.OK
    assert cache.can_admit(5, needs_new_prefix=True, seq_len=99) is Fit.TOO_LONG


def test_requests_of_one_frame_share_one_refcounted_prefix() -> None:
    cache = make_cache()
    prefix = cache.reserve_prefix()
    assert prefix == 0
    assert cache.is_prefix_used(0) and cache.prefix_refcount(0) == 0
    slots = [cache.allocate_slot(prefix, request_id) for request_id in ("a", "b")]
    assert slots == [0, 1]
    assert cache.prefix_refcount(0) == 2
    assert [cache.slot_prefix(slot) for slot in slots] == [0, 0]
    assert cache.num_used_prefixes == 1
    assert cache.used_bytes == 132 + 2 * 192
    cache.free_slot(0)
    assert cache.prefix_refcount(0) == 1 and cache.is_prefix_used(0)
    cache.free_slot(1)
    assert cache.prefix_refcount(0) == 0 and not cache.is_prefix_used(0)
    assert cache.num_used_prefixes == 0 and cache.used_bytes == 0


def test_lowest_free_slot_and_prefix_are_reused() -> None:
    cache = make_cache()
    first = cache.reserve_prefix()
    second = cache.reserve_prefix()
    assert (first, second) == (0, 1)
    assert [cache.allocate_slot(first, "a"), cache.allocate_slot(second, "b")] == [0, 1]
    assert cache.allocate_slot(second, "c") == 2
    cache.free_slot(0)  # prefix 0 loses its only slot
    assert not cache.is_prefix_used(0)
    assert cache.reserve_prefix() == 0
    assert cache.allocate_slot(0, "d") == 0
    assert cache.slot_of("d") == 0 and cache.request_of(0) == "d"
    assert cache.slot_of("a") is None
    usage = cache.usage()
    assert (usage.num_allocated_slots, usage.num_free_slots, usage.num_used_prefixes) == (3, 0, 2)


def test_allocation_errors() -> None:
    cache = make_cache()
    with pytest.raises(ValueError, match="not reserved"):
        cache.allocate_slot(0, "a")
    prefix = cache.reserve_prefix()
    cache.allocate_slot(prefix, "a")
    with pytest.raises(ValueError, match="already holds"):
        cache.allocate_slot(prefix, "a")
    cache.allocate_slot(prefix, "b")
    cache.allocate_slot(prefix, "c")
    with pytest.raises(RuntimeError, match="no free slot"):
        cache.allocate_slot(prefix, "d")
    cache.reserve_prefix()
    with pytest.raises(RuntimeError, match="no free prefix"):
        cache.reserve_prefix()
    with pytest.raises(ValueError, match="not allocated"):
        make_cache().free_slot(0)


def test_release_prefix_only_when_unreferenced() -> None:
    cache = make_cache()
    prefix = cache.reserve_prefix()
    cache.allocate_slot(prefix, "a")
    with pytest.raises(ValueError, match="referenced by 1"):
        cache.release_prefix(prefix)
    unused = cache.reserve_prefix()
    cache.release_prefix(unused)
    assert not cache.is_prefix_used(unused)


def test_store_prefix_writes_only_its_row() -> None:
    cache = make_cache()
    mask = jnp.asarray([True, True, True, False])
    assert cache.store_prefix(prefix_kv(1.0), prefix_kv(2.0), mask) == 0
    # A batch-1 prefill result ([L, 1, S, K, H], [1, S]) is accepted too.
    row = cache.store_prefix(prefix_kv(3.0)[:, None], prefix_kv(4.0)[:, None], mask[None])
    assert row == 1
    np.testing.assert_array_equal(cache.prefix_k[:, 0], 1.0)
    np.testing.assert_array_equal(cache.prefix_v[:, 0], 2.0)
    np.testing.assert_array_equal(cache.prefix_k[:, 1], 3.0)
    np.testing.assert_array_equal(cache.prefix_v[:, 1], 4.0)
    np.testing.assert_array_equal(cache.prefix_mask, [[1, 1, 1, 0], [1, 1, 1, 0]])
    store = cache.prefix_store
    assert store.k is cache.prefix_k and store.v is cache.prefix_v
    assert store.mask is cache.prefix_mask


def test_write_prefix_rejects_wrong_shapes_and_unreserved_rows() -> None:
    cache = make_cache()
    with pytest.raises(ValueError, match="not reserved"):
        cache.write_prefix(0, prefix_kv(1.0), prefix_kv(1.0), jnp.ones(4, bool))
    prefix = cache.reserve_prefix()
    with pytest.raises(ValueError, match="expected"):
        cache.write_prefix(prefix, prefix_kv(1.0)[:, :3], prefix_kv(1.0), jnp.ones(4, bool))
    with pytest.raises(ValueError, match="expected"):
        cache.store_prefix(prefix_kv(1.0), prefix_kv(1.0), jnp.ones(3, bool))
    assert cache.num_used_prefixes == 1  # the failed store gave its row back


def test_write_tails_writes_rows_sets_lengths_and_ignores_padding() -> None:
    cache = make_cache()
    prefix = cache.store_prefix(prefix_kv(1.0), prefix_kv(1.0), jnp.ones(4, bool))
    cache.allocate_slot(prefix, "x")  # slot 0 stays inactive
    slot_a = cache.allocate_slot(prefix, "a")
    slot_b = cache.allocate_slot(prefix, "b")
    assert (slot_a, slot_b) == (1, 2)
    # Fixed extend width 3 (one padding row), tail length 3.
    cache.write_tails(
        [slot_b, slot_a],
        tail_kv([7.0, 8.0, 99.0], 3),
        tail_kv([-7.0, -8.0, -99.0], 3),
        tail_lens=[3, 2],
        start_positions=[4, 3],
    )
    gen_k = np.asarray(cache.gen_k)
    np.testing.assert_array_equal(gen_k[:, 2, :3], 7.0)
    np.testing.assert_array_equal(gen_k[:, 1, :3], 8.0)
    np.testing.assert_array_equal(gen_k[:, 0], 0.0)
    np.testing.assert_array_equal(gen_k[:, :, 3:], 0.0)
    np.testing.assert_array_equal(np.asarray(cache.gen_v)[:, 2, :3], -7.0)
    assert [cache.slot_length(slot) for slot in range(3)] == [0, 2, 3]
    assert [cache.slot_position(slot) for slot in range(3)] == [0, 5, 7]
    assert cache.active_slots() == [1, 2]
    arrays = cache.slot_arrays()
    np.testing.assert_array_equal(arrays.active, [False, True, True])
    np.testing.assert_array_equal(arrays.length, [0, 2, 3])
    np.testing.assert_array_equal(arrays.position, [0, 5, 7])
    np.testing.assert_array_equal(arrays.prefix_index, [0, 0, 0])
    assert arrays.length.dtype == jnp.int32


def test_write_tails_validates_inputs() -> None:
    cache = make_cache()
    prefix = cache.reserve_prefix()
    slot = cache.allocate_slot(prefix, "a")
    tail = tail_kv([1.0], 2)
    with pytest.raises(ValueError, match="not allocated"):
        cache.write_tails([1], tail, tail, [2], [0])
    with pytest.raises(ValueError, match="out of range"):
        cache.write_tails([slot], tail, tail, [3], [0])
    with pytest.raises(ValueError, match="only 1 tail rows"):
        cache.write_tails([slot, slot], tail, tail, [1, 1], [0, 0])
    with pytest.raises(ValueError, match="exceeds"):
        long_tail = tail_kv([1.0], 7)
        cache.write_tails([slot], long_tail, long_tail, [7], [0])


def test_advance_moves_only_active_slots_and_refuses_overflow() -> None:
    cache = make_cache()
    prefix = cache.reserve_prefix()
    slot_a = cache.allocate_slot(prefix, "a")
    slot_b = cache.allocate_slot(prefix, "b")
    cache.allocate_slot(prefix, "c")  # never activated
    tail = tail_kv([0.0, 0.0], 5)
    cache.write_tails([slot_a, slot_b], tail, tail, [5, 2], [10, 10])
    cache.advance()
    assert [cache.slot_length(slot) for slot in range(3)] == [6, 3, 0]
    assert [cache.slot_position(slot) for slot in range(3)] == [16, 13, 0]
    with pytest.raises(RuntimeError, match=r"slots \[0\] are full"):
        cache.advance()
    cache.deactivate(slot_a)
    assert cache.slot_of("a") == slot_a and not cache.is_active(slot_a)
    cache.advance()
    assert [cache.slot_length(slot) for slot in range(3)] == [6, 4, 0]


def test_free_slot_resets_the_row() -> None:
    cache = make_cache()
    prefix = cache.reserve_prefix()
    slot = cache.allocate_slot(prefix, "a")
    tail = tail_kv([1.0], 2)
    cache.write_tails([slot], tail, tail, [2], [4])
    cache.free_slot(slot)
    assert (cache.slot_length(slot), cache.slot_position(slot), cache.is_active(slot)) == (
        0,
        0,
        False,
    )
    assert cache.request_of(slot) is None
    assert cache.num_active_slots == 0


def test_replace_gen_checks_shape_and_dtype() -> None:
    cache = make_cache()
    new_k = cache.gen_k + 1.0
    cache.replace_gen(new_k, cache.gen_v)
    assert cache.gen_k is new_k
    with pytest.raises(ValueError, match="gen_k"):
        cache.replace_gen(cache.gen_k[:, :2], cache.gen_v)
    with pytest.raises(ValueError, match="gen_v"):
        cache.replace_gen(cache.gen_k, cache.gen_v.astype(jnp.bfloat16))


def test_writes_compile_once_for_every_row_and_slot_count() -> None:
    layout = KVCacheLayout(4, 3, 5, 7, 1, 1, 3)  # shapes no other test uses
    cache = make_cache(layout)
    write_prefix = kv_cache_module._write_prefix_row
    write_tails = kv_cache_module.write_tail_rows
    prefix_before = write_prefix._cache_size()
    tails_before = write_tails._cache_size()
    mask = jnp.ones(5, bool)
    tail = tail_kv([1.0] * 4, 2, layout)  # fixed extend width 4
    held = cache.allocate_slot(
        cache.store_prefix(prefix_kv(0.0, layout), prefix_kv(0.0, layout), mask), "held"
    )
    for frame, num_admitted in enumerate((1, 2, 3, 1, 3)):
        prefix = cache.store_prefix(prefix_kv(frame, layout), prefix_kv(frame, layout), mask)
        assert prefix == 1  # row 0 holds "held"; rows 0 and 1 share one compilation
        slots = [cache.allocate_slot(prefix, f"{frame}-{i}") for i in range(num_admitted)]
        cache.write_tails(slots, tail, tail, [2] * num_admitted, [0] * num_admitted)
        for slot in slots:
            cache.free_slot(slot)
    cache.free_slot(held)
    assert write_prefix._cache_size() - prefix_before == 1
    assert write_tails._cache_size() - tails_before == 1
