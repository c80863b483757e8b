"""`LanguageKVCache`: fixed-capacity storage of all language decoding state.

Axis letters: L layers, P stored prefixes, B slots, S prefix length, T slot length
(tail + generated), K kv heads, H head dim.

Device buffers are allocated once, at construction, from a frozen `KVCacheLayout`:
- prefix store `prefix_k`, `prefix_v` `[L, P, S, K, H]` and `prefix_mask` `[P, S]`: one row per
  frame whose prefix language requests still read;
- slot buffers `gen_k`, `gen_v` `[L, B, T, K, H]`: per request, the kv of its tail and of the
  ids it generated, written left to right from index 0.
Host bookkeeping (numpy) says which rows are used: per slot its prefix row, length (valid
kv entries), next position id and whether it decodes; per prefix row a reference count.

Invariants:
- Shapes never change, so every jitted function that reads or writes these buffers compiles
  once; `total_bytes` is fixed at construction.
- Requests admitted in the same frame share ONE prefix row; `prefix_refcount[p]` equals the
  number of allocated slots reading row p, and a row is free again as soon as its last slot is
  freed. There are no per-request prefix copies.
- A free slot is inactive and has length 0; a slot is active only between `write_tails` and
  `deactivate`/`free_slot`; `slot_length <= T` always.
- Slots and prefix rows are handed out lowest free index first (deterministic).
- The cache answers "does it fit" (`can_admit`); it never chooses which request runs.
- Not thread-safe: one owner (the engine's step loop) calls it.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from oxygen_ros.engine.config import CacheConfig

_BOOL_BYTES = 1


class Fit(enum.Enum):
    """Answer of `LanguageKVCache.can_admit`."""

    OK = "ok"
    NO_SLOT = "no free request slot"
    NO_PREFIX = "no free prefix row"
    TOO_LONG = "tail plus max_tokens exceed the slot length"


@dataclasses.dataclass(frozen=True)
class KVCacheLayout:
    """Every shape and dtype of the cache (capacity from `CacheConfig`, dims from the model)."""

    num_slots: int  # B: requests decoding at once (rows of a decode step)
    num_prefixes: int  # P: stored frame prefixes
    prefix_len: int  # S: tokens of one frame prefix
    max_seq_len: int  # T: tail + generated kv entries one slot holds
    num_layers: int  # L: transformer depth of the prefix LLM
    num_kv_heads: int  # K
    head_dim: int  # H
    dtype: str = "float32"  # kv dtype, a jnp dtype name

    def __post_init__(self) -> None:
        for name in ("num_slots", "num_prefixes", "prefix_len", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVCacheLayout.{name} must be >= 1")
        for name in ("num_layers", "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"KVCacheLayout.{name} must be >= 1")

    @classmethod
    def from_config(
        cls,
        cache: CacheConfig,
        *,
        prefix_len: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: str,
    ) -> KVCacheLayout:
        """Combines the configured capacity with the model's kv dims."""
        return cls(
            num_slots=cache.num_slots,
            num_prefixes=cache.num_prefixes,
            prefix_len=prefix_len,
            max_seq_len=cache.max_seq_len,
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=dtype,
        )

    @property
    def itemsize(self) -> int:
        return jnp.dtype(self.dtype).itemsize

    @property
    def prefix_row_bytes(self) -> int:
        """Bytes of one stored prefix (k, v and mask)."""
        kv = 2 * self.num_layers * self.prefix_len * self.num_kv_heads * self.head_dim
        return kv * self.itemsize + self.prefix_len * _BOOL_BYTES

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot's k and v."""
        kv = 2 * self.num_layers * self.max_seq_len * self.num_kv_heads * self.head_dim
        return kv * self.itemsize

    @property
    def total_bytes(self) -> int:
        return self.num_prefixes * self.prefix_row_bytes + self.num_slots * self.slot_bytes


class PrefixStore(NamedTuple):
    """The stored prefixes as one batch (same fields as `model_fns.Prefix`)."""

    k: jax.Array  # [L, P, S, K, H]
    v: jax.Array  # [L, P, S, K, H]
    mask: jax.Array  # [P, S] bool, valid prefix positions


class SlotArrays(NamedTuple):
    """Per-slot device inputs of a decode step, `[B]` each."""

    prefix_index: jax.Array  # int32: prefix row the slot reads (0 for free slots)
    length: jax.Array  # int32: valid kv entries in the slot's gen row
    position: jax.Array  # int32: position id of the next token fed to the slot
    active: jax.Array  # bool: the row decodes this step


@dataclasses.dataclass(frozen=True)
class CacheUsage:
    """Occupancy snapshot, for stats and tests."""

    num_active_slots: int  # slots decoding
    num_allocated_slots: int  # slots held by a request (active or waiting for its tail)
    num_free_slots: int
    num_used_prefixes: int  # prefix rows reserved or referenced
    num_free_prefixes: int
    used_bytes: int  # bytes of used prefix rows and allocated slots
    total_bytes: int  # fixed at construction


@functools.partial(jax.jit, donate_argnums=(0, 1, 2))
def _write_prefix_row(
    store_k: jax.Array,
    store_v: jax.Array,
    store_mask: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array,
    row: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    store_k = jax.lax.dynamic_update_index_in_dim(store_k, k.astype(store_k.dtype), row, axis=1)
    store_v = jax.lax.dynamic_update_index_in_dim(store_v, v.astype(store_v.dtype), row, axis=1)
    store_mask = jax.lax.dynamic_update_index_in_dim(store_mask, mask, row, axis=0)
    return store_k, store_v, store_mask


@functools.partial(jax.jit, donate_argnums=(0, 1))
def write_tail_rows(
    gen_k: jax.Array,
    gen_v: jax.Array,
    tail_k: jax.Array,
    tail_v: jax.Array,
    slot_index: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Copies N tails `[L, N, U, K, H]` (U <= T) into slot rows `slot_index[N]` of the slot
    buffers `[L, B, T, K, H]` (donated); an index >= B is padding and dropped."""
    tail_len = tail_k.shape[2]
    gen_k = gen_k.at[:, slot_index, :tail_len].set(tail_k.astype(gen_k.dtype), mode="drop")
    gen_v = gen_v.at[:, slot_index, :tail_len].set(tail_v.astype(gen_v.dtype), mode="drop")
    return gen_k, gen_v


class LanguageKVCache:
    """Fixed-capacity language KV cache: stored prefixes with refcounts, and request slots."""

    def __init__(self, layout: KVCacheLayout) -> None:
        self.layout = layout
        dims = (layout.num_kv_heads, layout.head_dim)
        dtype = jnp.dtype(layout.dtype)
        prefix_shape = (layout.num_layers, layout.num_prefixes, layout.prefix_len, *dims)
        gen_shape = (layout.num_layers, layout.num_slots, layout.max_seq_len, *dims)
        self._prefix_k = jnp.zeros(prefix_shape, dtype)
        self._prefix_v = jnp.zeros(prefix_shape, dtype)
        self._prefix_mask = jnp.zeros((layout.num_prefixes, layout.prefix_len), jnp.bool_)
        self._gen_k = jnp.zeros(gen_shape, dtype)
        self._gen_v = jnp.zeros(gen_shape, dtype)
        # Host bookkeeping.
        self._prefix_used = np.zeros(layout.num_prefixes, np.bool_)
        self._prefix_refcount = np.zeros(layout.num_prefixes, np.int32)
        self._slot_request_ids: list[str | None] = [None] * layout.num_slots
        self._slot_prefix = np.zeros(layout.num_slots, np.int32)
        self._slot_length = np.zeros(layout.num_slots, np.int32)
        self._slot_position = np.zeros(layout.num_slots, np.int32)
        self._slot_active = np.zeros(layout.num_slots, np.bool_)
        self._request_slots: dict[str, int] = {}

    # ----------------------------------------------------------------------------------------
    # Capacity queries.

    @property
    def num_slots(self) -> int:
        return self.layout.num_slots

    @property
    def max_seq_len(self) -> int:
        return self.layout.max_seq_len

    @property
    def num_free_slots(self) -> int:
        return self.layout.num_slots - len(self._request_slots)

    @property
    def num_active_slots(self) -> int:
        return int(self._slot_active.sum())

    @property
    def num_used_prefixes(self) -> int:
        return int(self._prefix_used.sum())

    @property
    def num_free_prefixes(self) -> int:
        return self.layout.num_prefixes - self.num_used_prefixes

    @property
    def total_bytes(self) -> int:
        return self.layout.total_bytes

    @property
    def used_bytes(self) -> int:
        return (
            self.num_used_prefixes * self.layout.prefix_row_bytes
            + len(self._request_slots) * self.layout.slot_bytes
        )

    def usage(self) -> CacheUsage:
        return CacheUsage(
            num_active_slots=self.num_active_slots,
            num_allocated_slots=len(self._request_slots),
            num_free_slots=self.num_free_slots,
            num_used_prefixes=self.num_used_prefixes,
            num_free_prefixes=self.num_free_prefixes,
            used_bytes=self.used_bytes,
            total_bytes=self.total_bytes,
        )

    def can_admit(self, num_requests: int, *, needs_new_prefix: bool, seq_len: int = 0) -> Fit:
        """Says whether `num_requests` more requests fit now.

        Args:
            num_requests: requests to start together (each needs one slot).
            needs_new_prefix: whether they need a prefix row of their own (a new frame).
            seq_len: the longest `tail + max_tokens - 1` among them.

        Returns:
            TOO_LONG (never fits, whatever is freed) before NO_PREFIX before NO_SLOT, else OK.
        """
        if seq_len > self.layout.max_seq_len:
            return Fit.TOO_LONG
        if needs_new_prefix and num_requests > 0 and self.num_free_prefixes == 0:
            return Fit.NO_PREFIX
        if num_requests > self.num_free_slots:
            return Fit.NO_SLOT
        return Fit.OK

    # ----------------------------------------------------------------------------------------
    # Prefix rows.

    def reserve_prefix(self) -> int:
        """Takes the lowest free prefix row (refcount 0 until slots are allocated on it).

        Raises:
            RuntimeError: no free row (callers check `can_admit` first).
        """
        free = np.flatnonzero(~self._prefix_used)
        if free.size == 0:
            raise RuntimeError("no free prefix row")
        prefix_id = int(free[0])
        self._prefix_used[prefix_id] = True
        return prefix_id

    def write_prefix(self, prefix_id: int, k: jax.Array, v: jax.Array, mask: jax.Array) -> None:
        """Writes one frame's prefix into a reserved row (in place, donated buffers).

        Args:
            prefix_id: a row from `reserve_prefix`.
            k: `[L, S, K, H]` or `[L, 1, S, K, H]` (a batch-1 prefill result).
            v: same shape as `k`.
            mask: `[S]` or `[1, S]` bool, valid prefix tokens.
        """
        self._check_prefix_used(prefix_id)
        layout = self.layout
        kv_shape = (layout.num_layers, layout.prefix_len, layout.num_kv_heads, layout.head_dim)
        k = _drop_batch_axis(k, kv_shape, axis=1, name="k")
        v = _drop_batch_axis(v, kv_shape, axis=1, name="v")
        mask = _drop_batch_axis(mask, (layout.prefix_len,), axis=0, name="mask")
        self._prefix_k, self._prefix_v, self._prefix_mask = _write_prefix_row(
            self._prefix_k,
            self._prefix_v,
            self._prefix_mask,
            k,
            v,
            mask.astype(jnp.bool_),
            np.int32(prefix_id),
        )

    def store_prefix(self, k: jax.Array, v: jax.Array, mask: jax.Array) -> int:
        """`reserve_prefix` + `write_prefix`; returns the row."""
        prefix_id = self.reserve_prefix()
        try:
            self.write_prefix(prefix_id, k, v, mask)
        except Exception:
            self._prefix_used[prefix_id] = False
            raise
        return prefix_id

    def release_prefix(self, prefix_id: int) -> None:
        """Returns a reserved row that no slot references (e.g. its admissions failed).

        Raises:
            ValueError: slots still reference it.
        """
        self._check_prefix_used(prefix_id)
        if self._prefix_refcount[prefix_id] > 0:
            raise ValueError(
                f"prefix {prefix_id} is referenced by {self._prefix_refcount[prefix_id]} slots"
            )
        self._prefix_used[prefix_id] = False

    def prefix_refcount(self, prefix_id: int) -> int:
        return int(self._prefix_refcount[prefix_id])

    def is_prefix_used(self, prefix_id: int) -> bool:
        return bool(self._prefix_used[prefix_id])

    # ----------------------------------------------------------------------------------------
    # Slots.

    def allocate_slot(self, prefix_id: int, request_id: str) -> int:
        """Gives `request_id` the lowest free slot, reading prefix row `prefix_id`.

        The slot stays inactive (length 0) until `write_tails`.

        Raises:
            RuntimeError: no free slot. ValueError: unknown prefix or duplicate request id.
        """
        self._check_prefix_used(prefix_id)
        if request_id in self._request_slots:
            raise ValueError(f"request {request_id} already holds slot {self.slot_of(request_id)}")
        free = [i for i, rid in enumerate(self._slot_request_ids) if rid is None]
        if not free:
            raise RuntimeError("no free slot")
        slot = free[0]
        self._slot_request_ids[slot] = request_id
        self._request_slots[request_id] = slot
        self._slot_prefix[slot] = prefix_id
        self._slot_length[slot] = 0
        self._slot_position[slot] = 0
        self._slot_active[slot] = False
        self._prefix_refcount[prefix_id] += 1
        return slot

    def write_tails(
        self,
        slots: Sequence[int],
        tail_k: jax.Array,
        tail_v: jax.Array,
        tail_lens: Sequence[int],
        start_positions: Sequence[int],
    ) -> None:
        """Writes extend results into slots and activates them.

        Rows of `tail_k` beyond `len(slots)` are padding and ignored, so the extend batch
        can keep one fixed width (one compilation).

        Args:
            slots: allocated slots, one per leading row of the tail kv.
            tail_k: `[L, N, T_tail, K, H]` with `N >= len(slots)`, `T_tail <= T`.
            tail_v: same shape.
            tail_lens: valid tail tokens per slot (the slot's length afterwards).
            start_positions: position id of each slot's first tail token.
        """
        num_rows = tail_k.shape[1]
        if not len(slots) == len(tail_lens) == len(start_positions):
            raise ValueError("slots, tail_lens and start_positions differ in length")
        if len(slots) > num_rows:
            raise ValueError(f"{len(slots)} slots but only {num_rows} tail rows")
        if tail_k.shape[2] > self.layout.max_seq_len:
            raise ValueError(f"tail length {tail_k.shape[2]} exceeds {self.layout.max_seq_len}")
        for slot, tail_len in zip(slots, tail_lens, strict=True):
            self._check_slot_allocated(slot)
            if not 0 < tail_len <= tail_k.shape[2]:
                raise ValueError(f"slot {slot}: tail length {tail_len} out of range")
        slot_index = np.full(num_rows, self.layout.num_slots, np.int32)
        slot_index[: len(slots)] = slots
        self._gen_k, self._gen_v = write_tail_rows(
            self._gen_k, self._gen_v, tail_k, tail_v, slot_index
        )
        for slot, tail_len, start in zip(slots, tail_lens, start_positions, strict=True):
            self._slot_length[slot] = tail_len
            self._slot_position[slot] = start + tail_len
            self._slot_active[slot] = True

    def advance(self) -> None:
        """Records one decode step: every active slot gained one kv entry.

        Raises:
            RuntimeError: an active slot would exceed T (admission should have refused it).
        """
        active = self._slot_active
        if np.any(self._slot_length[active] >= self.layout.max_seq_len):
            full = np.flatnonzero(active & (self._slot_length >= self.layout.max_seq_len))
            raise RuntimeError(f"slots {full.tolist()} are full; deactivate them first")
        self._slot_length[active] += 1
        self._slot_position[active] += 1

    def deactivate(self, slot: int) -> None:
        """Stops decoding a slot but keeps it (and its prefix) allocated."""
        self._check_slot_allocated(slot)
        self._slot_active[slot] = False

    def free_slot(self, slot: int) -> None:
        """Frees a slot at once; its prefix row is released when no slot reads it any more."""
        self._check_slot_allocated(slot)
        request_id = self._slot_request_ids[slot]
        assert request_id is not None
        prefix_id = int(self._slot_prefix[slot])
        del self._request_slots[request_id]
        self._slot_request_ids[slot] = None
        self._slot_prefix[slot] = 0
        self._slot_length[slot] = 0
        self._slot_position[slot] = 0
        self._slot_active[slot] = False
        self._prefix_refcount[prefix_id] -= 1
        if self._prefix_refcount[prefix_id] == 0:
            self._prefix_used[prefix_id] = False

    def slot_of(self, request_id: str) -> int | None:
        return self._request_slots.get(request_id)

    def request_of(self, slot: int) -> str | None:
        return self._slot_request_ids[slot]

    def slot_prefix(self, slot: int) -> int:
        self._check_slot_allocated(slot)
        return int(self._slot_prefix[slot])

    def slot_length(self, slot: int) -> int:
        return int(self._slot_length[slot])

    def slot_position(self, slot: int) -> int:
        return int(self._slot_position[slot])

    def is_active(self, slot: int) -> bool:
        return bool(self._slot_active[slot])

    def active_slots(self) -> list[int]:
        return np.flatnonzero(self._slot_active).tolist()

    # ----------------------------------------------------------------------------------------
    # Buffers for the runner.

    @property
    def prefix_store(self) -> PrefixStore:
        return PrefixStore(self._prefix_k, self._prefix_v, self._prefix_mask)

    @property
    def prefix_k(self) -> jax.Array:
        return self._prefix_k

    @property
    def prefix_v(self) -> jax.Array:
        return self._prefix_v

    @property
    def prefix_mask(self) -> jax.Array:
        return self._prefix_mask

    @property
    def gen_k(self) -> jax.Array:
        return self._gen_k

    @property
    def gen_v(self) -> jax.Array:
        return self._gen_v

    def slot_arrays(self) -> SlotArrays:
        """Per-slot decode inputs as device arrays (copies of the host bookkeeping)."""
        return SlotArrays(
            prefix_index=jnp.asarray(self._slot_prefix),
            length=jnp.asarray(self._slot_length),
            position=jnp.asarray(self._slot_position),
            active=jnp.asarray(self._slot_active),
        )

    def replace_gen(self, gen_k: jax.Array, gen_v: jax.Array) -> None:
        """Installs the slot buffers a (donating) decode step returned; shapes must match."""
        for name, new, old in (("gen_k", gen_k, self._gen_k), ("gen_v", gen_v, self._gen_v)):
            if new.shape != old.shape or new.dtype != old.dtype:
                raise ValueError(
                    f"{name} {new.shape} {new.dtype} does not match {old.shape} {old.dtype}"
                )
        self._gen_k, self._gen_v = gen_k, gen_v

    # ----------------------------------------------------------------------------------------

    def _check_prefix_used(self, prefix_id: int) -> None:
        if not 0 <= prefix_id < self.layout.num_prefixes or not self._prefix_used[prefix_id]:
            raise ValueError(f"prefix {prefix_id} is not reserved")

    def _check_slot_allocated(self, slot: int) -> None:
        if not 0 <= slot < self.layout.num_slots or self._slot_request_ids[slot] is None:
            raise ValueError(f"slot {slot} is not allocated")


def _drop_batch_axis(x: jax.Array, shape: tuple[int, ...], *, axis: int, name: str) -> jax.Array:
    if x.ndim == len(shape) + 1 and x.shape[axis] == 1:
        x = jnp.squeeze(x, axis=axis)
    if tuple(x.shape) != shape:
        raise ValueError(f"prefix {name} has shape {tuple(x.shape)}, expected {shape}")
    return x
