"""Counts XLA compilations of a continuous-batching engine in a fresh process (test_compiles.py).

Run as `python -P test/engine/compile_probe.py [--force-compile]`. It builds the `tiny`
preset's engine, calls `warmup()`, then serves language requests so that the decode step runs
at every active count 1..num_slots, with greedy and sampled requests mixed, then admits 2 and
3 one-token requests together (so the tail extend runs at every width 1, 2, 4), and prints one
JSON line:

- `warmup`: compilations `warmup()` triggered (> 0: it compiled what a frame uses);
- `serve`: compilations while serving after the warm-up (0 is the claim under test);
- `decode_sizes`: active rows of each decode step while serving;
- `extend_widths`: rows of each tail extend while serving;
- `control`: compilations while serving the same requests again after `jax.clear_caches()`,
  so the counter is seen to move in this very process (the positive control).

`--force-compile` clears JAX's caches between `warmup()` and serving: `serve` is then > 0 and
the test's claim fails, which is how that failure looks.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import jax
from engine_factories import (
    make_engine_config,
    make_observation,
    make_request,
    record_decode_sizes,
)

from oxygen_ros.engine import compiles
from oxygen_ros.engine.config import SchedulerConfig
from oxygen_ros.engine.engine import Engine
from oxygen_ros.engine.types import RequestKind

KINDS = (RequestKind.NARRATION, RequestKind.MEMORY, RequestKind.SUBTASK)


def serve(engine: Engine, tag: str) -> tuple[int, list[int], list[int]]:
    """One new request per frame until every slot is busy, then frames until all finished,
    then two frames admitting 2 and 3 one-token requests together.

    Returns the compilations it triggered, the active rows of every decode step and the
    rows of every tail extend.
    """
    num_slots = engine.cache.num_slots
    decode_step, extend_width = engine.runner.decode_step, engine.runner.extend_width
    sizes = record_decode_sizes(engine)
    widths: list[int] = []

    def record_width(num_requests: int) -> int:
        widths.append(extend_width(num_requests))
        return widths[-1]

    engine.runner.extend_width = record_width  # type: ignore[method-assign]
    before = compiles.num_compiles()
    for frame in range(4 * num_slots):
        requests = []
        if frame < num_slots:
            requests.append(
                make_request(
                    KINDS[frame % len(KINDS)],
                    request_id=f"{tag}-{frame}",
                    max_tokens=2 * num_slots + 1,
                    ignore_eos=True,
                    temperature=0.8 if frame % 2 else 0.0,
                    seed=frame,
                )
            )
        engine.step(make_observation(frame), requests, noise=engine.make_noise(frame))
        stats = engine.stats()
        if frame >= num_slots and stats.num_running == 0 and stats.num_waiting == 0:
            break
    for count in (2, 3):  # admitted together: one extend of width 2, then of width 4
        burst = [
            make_request(
                KINDS[i % len(KINDS)],
                request_id=f"{tag}-burst{count}-{i}",
                max_tokens=1,
                ignore_eos=True,
                temperature=0.8 if i % 2 else 0.0,
                seed=i,
            )
            for i in range(count)
        ]
        engine.step(make_observation(count), burst, noise=engine.make_noise(count))
    engine.runner.decode_step = decode_step  # type: ignore[method-assign]
    engine.runner.extend_width = extend_width  # type: ignore[method-assign]
    return compiles.num_compiles() - before, sizes, widths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--force-compile",
        action="store_true",
        help="clear JAX's caches after warmup() (serving then compiles again)",
    )
    args = parser.parse_args()
    scheduler = SchedulerConfig(mode="continuous", policy="fixed", decode_steps_per_frame=2)
    engine = Engine(make_engine_config(scheduler=scheduler))
    warmup = engine.warmup()
    if args.force_compile:
        jax.clear_caches()
    served, sizes, widths = serve(engine, "serve")
    jax.clear_caches()
    control, _, _ = serve(engine, "control")
    report = {
        "num_slots": engine.cache.num_slots,
        "warmup": warmup,
        "serve": served,
        "decode_sizes": sizes,
        "extend_widths": widths,
        "control": control,
    }
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
