"""Does the engine inside the ROS graph say what the same engine says offline on the same input?

Reads the observation frames and the finished language outputs that `benchmarks/closed_loop
--record-frames DIR` saved (what perception published; what the inference node said, with the
stamp of the observation each request started from), serves each such observation to an engine
built from the same checkpoint outside ROS (`shared_kv`, greedy decoding) with a request of the
same kind, and counts how often the words agree. Agreement near 1 means the graph feeds the
model what it was trained on and serves its words unchanged, so a difference between the
closed loop through ROS and the rollout without ROS comes from the trajectory (timing, what the
actions did), not from the path the observation takes.

The frame's state is taken by name in the checkpoint's order: the workcell's joints, then the
object state's names (`--object-state`, as the checkpoint was trained).

`python benchmarks/replay_frames.py --frames DIR --checkpoint CKPT --object-state target`
(after `source scripts/env.sh`) writes JSON (default DIR/replay.json) and prints one line per
disagreement; the last line is `replay_frames agreement=<a> outputs=<n>`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

# SpeechToken kinds (msg/SpeechToken.msg) -> engine request kinds; memory entries come apart.
SPEECH_KINDS = {0: "subtask", 1: "narration"}


def recorded_outputs(z) -> list[tuple[str, str, float]]:
    """(kind, text, observation stamp) of every finished output in one episode's record."""
    out = []
    for item in z["speech"]:
        kind, text, stamp = json.loads(str(item))
        if kind in SPEECH_KINDS:
            out.append((SPEECH_KINDS[kind], text, stamp))
    for item in z["memory"]:
        text, stamp = json.loads(str(item))
        out.append(("memory", text, stamp))
    return out


def main(argv: list[str] | None = None) -> int:
    from oxygen_ros.engine.config import SchedulerConfig
    from oxygen_ros.engine.engine import Engine
    from oxygen_ros.engine.types import LanguageRequest, Observation, RequestKind
    from oxygen_ros.resources import resolve_path
    from oxygen_ros.training import data, train

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", required=True, help="closed_loop --record-frames DIR")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", default="", help="JSON path (default <frames>/replay.json)")
    data.add_object_state_argument(parser)  # as the checkpoint was trained
    args = parser.parse_args(argv)
    frames_dir = Path(args.frames)
    preset = data.model_preset(args.preset, args.object_state)
    names = data.state_names(args.object_state)
    engine = Engine(
        train.engine_config(
            resolve_path(args.checkpoint),
            preset=preset,
            scheduler=SchedulerConfig(mode="shared_kv"),
        )
    )
    rows = []
    files = sorted(frames_dir.glob("seed_*.npz"), key=lambda p: int(p.stem.split("_")[1]))
    if not files:
        raise SystemExit(f"no seed_*.npz in {frames_dir}")
    for path in files:
        z = np.load(path)
        stamps = z["stamps"]
        order = [list(z["state_names"]).index(n) for n in names]
        slots = [str(s) for s in z["image_names"]]
        for kind, said, stamp in recorded_outputs(z):
            k = int(np.argmin(np.abs(stamps - stamp)))
            if abs(stamps[k] - stamp) > 1e-6:  # from a frame before the recording began
                continue
            observation = Observation(
                images={s: z["images"][k, i] for i, s in enumerate(slots)},
                image_masks={s: bool(z["image_valid"][k, i]) for i, s in enumerate(slots)},
                state=z["state"][k, order].astype(np.float32),
                prompt=str(z["instruction"]),
                stamp=float(stamp),
            )
            result = engine.step(observation, [LanguageRequest(RequestKind(kind))])
            offline = next(o.text for o in result.outputs).strip()
            rows.append(
                {
                    "episode": path.stem,
                    "t": float(stamp - z["reset_s"]),
                    "kind": kind,
                    "ros": said,
                    "offline": offline,
                    "agree": said == offline,
                }
            )
            if said != offline:
                print(f"{path.stem} {kind}@{stamp - z['reset_s']:.2f}s ros {said!r} offline "
                      f"{offline!r}")  # fmt: skip
    agreement = float(np.mean([r["agree"] for r in rows])) if rows else float("nan")
    by_kind = {
        kind: float(np.mean([r["agree"] for r in rows if r["kind"] == kind]))
        for kind in sorted({r["kind"] for r in rows})
    }
    out = Path(args.out) if args.out else frames_dir / "replay.json"
    out.write_text(
        json.dumps(
            {
                "checkpoint": args.checkpoint,
                "frames": str(frames_dir),
                "agreement": agreement,
                "agreement_by_kind": by_kind,
                "outputs": rows,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    print(f"replay_frames agreement={agreement:.3f} outputs={len(rows)} by_kind={by_kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
