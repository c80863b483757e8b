"""DAgger's labels from the feedback expert: what it would command from the states a learner
visits (ROS-free).

Behaviour cloning only ever sees the expert's own states; in closed loop the learner drifts off
them and has no label there (docs/TRAINING.md, runs 12-13). DAgger (Ross et al. 2011) runs the
learner, asks the expert what it would have done at each state the learner reached, and trains
on the union. Here the expert is `FeedbackExpert` and "what it would have done" is its chunk:
from the workcell's state at an observation, the expert drives the arms at the control rate for
one horizon and its command every 1/fps seconds is a row, exactly as `generate_demos` records
a demonstration's chunk (row 0 is the command at the observation). Then the physics state and
the expert's phase machine are put back, so the learner's episode goes on unchanged.

The expert's phase machine follows the learner: the command at each observation is kept
(a waypoint the learner reached advances the phase), the rest of the look-ahead is not; with
`regrasp_m` a cube the learner dropped is picked up again.

`LabellingPolicy` wraps any rollout policy (`training.rollout.run_episode`'s reset/act):
it records (state, joint velocities, time, expert chunk, expert subtask) at every observation
and executes the learner's chunk (or, with probability `beta`, the expert's: DAgger's mixture).

Invariants:
- Labelling does not change the episode: the physics state and the expert's phase machine after
  `label()` equal those before, except for the phase advance of the kept first command.
- Labels use the expert's privileged state (true cube poses); the recorded inputs are only what
  the policy observed.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from oxygen_ros.sim import robot, tasks
from oxygen_ros.sim.feedback_expert import FeedbackExpert
from oxygen_ros.sim.generate_demos import CONTROL_HZ, FPS
from oxygen_ros.sim.workcell import Workcell


@dataclasses.dataclass(frozen=True)
class LabelConfig:
    horizon: int = 10  # chunk rows
    fps: float = FPS  # rows per second
    control_hz: float = CONTROL_HZ  # expert commands per second during the look-ahead

    def __post_init__(self) -> None:
        if (
            self.horizon < 1
            or abs(round(self.control_hz / self.fps) * self.fps - self.control_hz) > 1e-9
        ):
            raise ValueError("need horizon >= 1 and control_hz a multiple of fps")


def expert_chunk(
    workcell: Workcell, expert: FeedbackExpert, config: LabelConfig = LabelConfig()
) -> tuple[np.ndarray, str]:
    """The expert's chunk [horizon, 14] from the workcell's current state and its subtask
    label there; the workcell and the expert are left as after the first command."""
    physics = workcell.physics_state()
    first = expert.command(workcell)  # kept: the phase machine follows the learner
    subtask = expert.subtask
    kept = expert.snapshot()
    per_row = round(config.control_hz / config.fps)
    dt = 1.0 / config.control_hz
    rows = [first]
    target = first
    try:
        for tick in range(1, config.horizon * per_row):
            workcell.set_targets(target)
            workcell.step(dt)
            target = expert.command(workcell)
            if tick % per_row == 0:
                rows.append(target)
    finally:
        expert.restore(kept)
        workcell.set_physics_state(physics)
    return np.stack(rows), subtask


@dataclasses.dataclass
class Labels:
    """Per observation of the labelled episodes (`arrays()` stacks them)."""

    state: list[np.ndarray] = dataclasses.field(default_factory=list)  # as observed [S]
    qvel: list[np.ndarray] = dataclasses.field(default_factory=list)  # [14]
    time: list[float] = dataclasses.field(default_factory=list)  # s since the episode began
    actions: list[np.ndarray] = dataclasses.field(default_factory=list)  # expert chunk [A, 14]
    subtask: list[str] = dataclasses.field(default_factory=list)  # the expert's phase label
    seed: list[int] = dataclasses.field(default_factory=list)

    def arrays(self) -> dict[str, np.ndarray]:
        return {
            "state": np.asarray(self.state, np.float32),
            "qvel": np.asarray(self.qvel, np.float32),
            "time": np.asarray(self.time, np.float32),
            "actions": np.asarray(self.actions, np.float32),
            "seed": np.asarray(self.seed, np.int64),
        }


class LabellingPolicy:
    """Runs `learner` and labels every observation with the expert's chunk."""

    def __init__(
        self,
        learner,
        expert: FeedbackExpert,
        labels: Labels,
        beta: float = 0.0,
        config: LabelConfig = LabelConfig(),
        seed: int = 0,
    ) -> None:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        self.learner, self.expert, self.labels = learner, expert, labels
        self.beta, self.config = beta, config
        self._rng = np.random.default_rng(seed)
        self._start, self._seed = 0.0, 0

    def reset(self, workcell: Workcell, spec: tasks.EpisodeSpec) -> None:
        self.learner.reset(workcell, spec)
        self.expert.reset(workcell, spec)
        self._start, self._seed = workcell.time, spec.seed

    def act(self, workcell: Workcell, observation) -> tuple[np.ndarray, str | None]:
        rows, subtask = expert_chunk(workcell, self.expert, self.config)
        labels = self.labels
        labels.state.append(np.asarray(observation.state, np.float32))
        labels.qvel.append(workcell.joint_velocities().astype(np.float32))
        labels.time.append(observation.stamp - self._start)
        labels.actions.append(rows.astype(np.float32))
        labels.subtask.append(subtask)
        labels.seed.append(self._seed)
        if self._rng.random() < self.beta:
            return rows[:, : robot.NUM_JOINTS], subtask
        return self.learner.act(workcell, observation)
