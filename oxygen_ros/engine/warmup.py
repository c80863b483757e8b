"""The engine's warm-up: compile everything a frame uses before serving.

`Warmup` is the part of `Engine` (engine.py) that runs `warmup()`: frames on a blank
observation with short requests (one per extend width the mode admits with, greedy and
sampled), then the prefill of every subset of `warmup_masked_slots` masked; the counters,
the cost model and the request bookkeeping are put back as they were.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from oxygen_ros.engine import compiles
from oxygen_ros.engine.scheduler import FrameScheduler
from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind


class Warmup:
    """`warmup()`, mixed into `Engine`: it runs the engine's own frames (`Engine._frame`) and
    puts back the engine's bookkeeping (`Engine.__init__`)."""

    def warmup(self) -> int:
        """Compiles everything a frame uses (blank observation, a short request, and a frame
        per extend width the mode admits with).

        Counters, the cost model and the request bookkeeping are left as they were.

        Returns:
            XLA compilations it triggered.

        Raises:
            RuntimeError: requests are live (warm up before serving).
        """
        if self._live or self._refused_early:
            raise RuntimeError("warmup() needs an idle engine")
        before = compiles.num_compiles()
        saved = dataclasses.replace(self._counters)
        saved_next, saved_order = self._next_request, self._next_order
        model = self.config.model
        state_dim = (
            int(np.shape(self.normalizer.state_stats.mean)[-1])
            if self.normalizer.state_stats is not None
            else self.action_output_dim
        )
        observation = Observation(
            images={k: np.zeros((*model.image_resolution, 3), np.uint8) for k in model.image_keys},
            image_masks={k: True for k in model.image_keys},
            state=np.zeros((state_dim,), np.float32),
            prompt="warm up",
            stamp=0.0,
        )
        noise = np.zeros((1, model.action_horizon, model.action_dim), np.float32)
        # One short request (prefill, denoise, a one-row extend, decode steps), then, unless
        # requests are admitted one at a time (isolated), one frame per wider extend: that many
        # one-token requests admitted together.
        # Then the same with sampled requests: extends and decode steps compile a greedy and a
        # sampling variant (`sample_tokens`).
        widths = (1,) if self.mode == "isolated" else self.runner.extend_widths
        passes = [(width, hot) for hot in (0.0, 1.0) for width in widths]
        warmup_ids: list[str] = []
        for index, (width, temperature) in enumerate(passes):
            specs = [
                LanguageRequest(
                    RequestKind.SUBTASK,
                    max_tokens=2 if width == 1 else 1,
                    temperature=temperature,
                    request_id=f"__warmup_{index}_{i}__",
                    ignore_eos=True,
                )
                for i in range(width)
            ]
            warmup_ids += [spec.request_id for spec in specs]  # type: ignore[misc]
            self._frame(observation, specs, noise, self.mode)
            for _ in range(3):
                if not self._live:
                    break
                self._frame(observation, (), noise, self.mode)
            if self._live:
                for request_id in list(self._live):
                    self.abort(request_id)
                self._frame(observation, (), noise, self.mode)
        self._warm_masked_prefills(observation)
        self._warmed_up = True
        self._counters = saved
        self._next_request, self._next_order = saved_next, saved_order
        for request_id in warmup_ids:
            self._final_status.pop(request_id, None)
        self._last_timings = None
        # A fresh scheduler: no warm-up costs (compile times) in the deadline cost model.
        self.scheduler = FrameScheduler(self.config.scheduler, self.cache)
        self.chunk_guide.reset()  # warm-up chunks and latencies are not the robot's
        return compiles.num_compiles() - before

    def _warm_masked_prefills(self, observation: Observation) -> None:
        """Compiles the prefill for every subset of `warmup_masked_slots` masked."""
        masked_slots = self.config.warmup_masked_slots
        for count in range(1, len(masked_slots) + 1):
            for masked in itertools.combinations(masked_slots, count):
                masks = {key: key not in masked for key in observation.image_masks}
                inputs = self.prepare_inputs(dataclasses.replace(observation, image_masks=masks))
                self._prefill(inputs)
