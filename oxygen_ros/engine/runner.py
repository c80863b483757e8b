"""`Runner`: a frame's schedule as jitted model calls on the `LanguageKVCache`.

The scheduler decides who runs (a `FrameSchedule`); the runner does the device work and
leaves policy alone:
- `prefill` / `denoise`: one observation's prefix and its action chunk;
- `admit`: stores the frame's prefix in the row the scheduler reserved, extends the admitted
  requests' tails from it and samples each one's first id;
- `decode_step`: one batched step over ALL slot rows (inactive rows masked), sampling one id
  per active slot.

Shapes come from a fixed set, never from the number of active requests: an extend runs the
smallest width of `extend_widths` (powers of two up to `extend_rows`, and `extend_rows`)
that holds the requests admitted together, with tails of `max_tail_len` tokens (padding rows
have an empty tail mask and are dropped when the tails are written); a decode step always
runs the cache's `num_slots` rows. An extend's cost grows with its rows (on this CPU, tiny
preset, 640-row head: 3.7 ms at 1 row, 17 ms at 8; 9 ms and 42 ms with the 257,152-row
head), and one admission per frame is the common case, so a lone request no longer pays for
`extend_rows`. After `Engine.warmup` (a frame per width) nothing compiles again, whatever
the number (1..num_slots) of active or admitted requests.

Invariants:
- The cache owns every language buffer; the runner only hands them to jitted functions and
  installs what the donating calls return.
- Per active slot the cache's next position equals its prefix's valid length plus its
  length, which is the position `decode_step` derives itself; the runner checks this before
  each step.
- Token i of a request is sampled with index i (`Request.num_output_tokens`), so its tokens
  never depend on which rows, frames or batch it ran with.
- No clock reads and no policy: the engine times the calls and the scheduler decides.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import jax
import numpy as np

from oxygen_ros.engine.kv_cache import LanguageKVCache
from oxygen_ros.engine.model_fns import JitModel, Prefix, PrefixInputs
from oxygen_ros.engine.requests import Request


def extend_widths(extend_rows: int) -> tuple[int, ...]:
    """Extend batch widths: powers of two below `extend_rows`, then `extend_rows` itself."""
    widths = [1 << i for i in range(extend_rows.bit_length()) if 1 << i < extend_rows]
    return (*widths, extend_rows)


class Runner:
    """Executes prefills, denoising, tail extends and decode steps on one cache."""

    def __init__(
        self, model: JitModel, cache: LanguageKVCache, *, extend_rows: int, max_tail_len: int
    ) -> None:
        """Binds a jitted model to a cache.

        Args:
            model: the jitted model functions bound to parameters.
            cache: the language cache whose buffers every language call reads and writes.
            extend_rows: rows of one batched extend (>= 1); more admissions run in chunks.
            max_tail_len: tokens of a padded tail (<= the cache's max_seq_len).
        """
        if extend_rows < 1:
            raise ValueError("extend_rows must be >= 1")
        if not 1 <= max_tail_len <= cache.max_seq_len:
            raise ValueError(f"max_tail_len must be in [1, {cache.max_seq_len}]")
        self.model = model
        self.cache = cache
        self.extend_rows = extend_rows
        self.extend_widths = extend_widths(extend_rows)
        self.max_tail_len = max_tail_len
        self._prefix_valid_len = np.zeros(cache.layout.num_prefixes, np.int32)

    # ----------------------------------------------------------------------------------------
    # Actions.

    def prefill(self, inputs: PrefixInputs, valid_slots: Sequence[str] | None = None) -> Prefix:
        """The prefix kv of a batch-1 observation (waited for), encoding only `valid_slots`
        (None: every slot)."""
        return jax.block_until_ready(self.model.prefill(inputs, valid_slots))

    def denoise(self, prefix: Prefix, noise: np.ndarray) -> np.ndarray:
        """Normalised action chunk `[1, A, J]` from `prefix` and `noise` (waited for)."""
        return np.asarray(self.model.denoise(prefix, noise))

    def denoise_rtc(
        self,
        prefix: Prefix,
        noise: np.ndarray,
        previous: np.ndarray,
        frozen_rows: int,
        guided_rows: int,
        max_guidance: float,
    ) -> np.ndarray:
        """`denoise` guided towards `previous` [1, A, J] (normalised, aligned): real-time
        chunking; the row counts and the weight cap are data, so they never recompile."""
        out = self.model.denoise_rtc(
            prefix,
            noise,
            np.asarray(previous, np.float32),
            np.int32(frozen_rows),
            np.int32(guided_rows),
            np.float32(max_guidance),
        )
        return np.asarray(out)

    # ----------------------------------------------------------------------------------------
    # Language.

    def extend_width(self, num_requests: int) -> int:
        """Rows of the extend that admits `num_requests` (1..extend_rows) together."""
        if not 1 <= num_requests <= self.extend_rows:
            raise ValueError(f"num_requests must be in [1, {self.extend_rows}]")
        return next(width for width in self.extend_widths if width >= num_requests)

    def num_extends(self, num_admitted: int) -> int:
        """Batched extends `admit` runs for `num_admitted` requests."""
        return -(-num_admitted // self.extend_rows)

    def admit(
        self, prefix: Prefix, prefix_id: int, admitted: Sequence[tuple[int, Request]]
    ) -> list[int]:
        """Stores `prefix` in row `prefix_id`, extends the admitted tails, samples first ids.

        Args:
            prefix: the frame's batch-1 prefix (from `prefill`).
            prefix_id: the row the scheduler reserved for this frame.
            admitted: (slot, request) per admitted request; each slot is allocated on
                `prefix_id` and not active yet.

        Returns:
            The first sampled id of each admitted request, in order (an EOS id included:
            the caller's request bookkeeping decides what it means).
        """
        cache = self.cache
        cache.write_prefix(prefix_id, prefix.k, prefix.v, prefix.mask)
        valid_len = int(np.asarray(prefix.mask).sum())
        self._prefix_valid_len[prefix_id] = valid_len
        first_ids: list[int] = []
        tail_len = self.max_tail_len
        for start in range(0, len(admitted), self.extend_rows):
            chunk = admitted[start : start + self.extend_rows]
            rows = self.extend_width(len(chunk))
            tokens = np.zeros((rows, tail_len), np.int32)
            mask = np.zeros((rows, tail_len), bool)
            temperature = np.zeros((rows,), np.float32)
            seeds = np.zeros((rows,), np.int32)
            indices = np.zeros((rows,), np.int32)
            for row, (slot, request) in enumerate(chunk):
                if cache.slot_prefix(slot) != prefix_id or cache.is_active(slot):
                    raise ValueError(f"slot {slot} is not a fresh slot on prefix {prefix_id}")
                num_tail = request.num_prompt_tokens
                if num_tail > tail_len:
                    raise ValueError(
                        f"request {request.request_id}: tail of {num_tail} ids exceeds "
                        f"max_tail_len={tail_len}"
                    )
                tokens[row, :num_tail] = request.prompt_token_ids
                mask[row, :num_tail] = True
                temperature[row] = request.temperature
                seeds[row] = request.seed
                indices[row] = request.num_output_tokens
            prefix_rows = np.full((rows,), prefix_id, np.int32)
            tail_k, tail_v, logits = self.model.extend(
                cache.prefix_store, prefix_rows, tokens, mask
            )
            cache.write_tails(
                [slot for slot, _ in chunk],
                tail_k,
                tail_v,
                [request.num_prompt_tokens for _, request in chunk],
                [valid_len] * len(chunk),
            )
            sampled = np.asarray(self.model.sample_tokens(logits, temperature, seeds, indices))
            first_ids += [int(token) for token in sampled[: len(chunk)]]
        return first_ids

    def decode_step(self, running: Mapping[int, Request]) -> dict[int, int]:
        """One batched decode step over every slot row.

        Args:
            running: slot -> request for exactly the cache's active slots; each request has
                at least one output id (its last one is fed).

        Returns:
            slot -> the id sampled for it.
        """
        cache = self.cache
        num_slots = cache.num_slots
        active_slots = cache.active_slots()
        if sorted(running) != active_slots:
            raise RuntimeError(f"running slots {sorted(running)} != active slots {active_slots}")
        tokens = np.zeros((num_slots,), np.int32)
        temperature = np.zeros((num_slots,), np.float32)
        seeds = np.zeros((num_slots,), np.int32)
        indices = np.zeros((num_slots,), np.int32)
        for slot, request in running.items():
            if not request.output_token_ids:
                raise RuntimeError(f"request {request.request_id} has no id to feed")
            expected = self._prefix_valid_len[cache.slot_prefix(slot)] + cache.slot_length(slot)
            if cache.slot_position(slot) != expected:
                raise RuntimeError(
                    f"slot {slot}: cache position {cache.slot_position(slot)} != {expected}"
                )
            tokens[slot] = request.output_token_ids[-1]
            temperature[slot] = request.temperature
            seeds[slot] = request.seed
            indices[slot] = request.num_output_tokens
        slot_arrays = cache.slot_arrays()
        sampled, gen_k, gen_v = self.model.decode_sample(
            cache.prefix_store,
            slot_arrays.prefix_index,
            cache.gen_k,
            cache.gen_v,
            slot_arrays.length,
            tokens,
            slot_arrays.active,
            temperature,
            seeds,
            indices,
        )
        cache.replace_gen(gen_k, gen_v)
        cache.advance()
        sampled = np.asarray(sampled)
        return {slot: int(sampled[slot]) for slot in running}
