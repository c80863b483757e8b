"""Shared by the sim tests: episodes of one template, and a learner-like grip off the cube's
centre made by the reactive expert's own steering."""

from __future__ import annotations

import itertools

import numpy as np

from oxygen_ros.sim import generate_demos, robot, tasks
from oxygen_ros.sim.reactive_expert import ReactiveExpert
from oxygen_ros.sim.workcell import Workcell

CONTROL_DT = 1.0 / generate_demos.CONTROL_HZ


def specs(template: str, count: int, start: int = 0) -> list[tasks.EpisodeSpec]:
    """The first `count` episodes of `template` from seed `start` on."""
    drawn = (tasks.sample_episode(s) for s in itertools.count(start))
    return list(itertools.islice((s for s in drawn if s.template == template), count))


def grip_above_centre(
    cell: Workcell, spec: tasks.EpisodeSpec, height_m: float, lift_m: float = 0.02
) -> None:
    """Closes `spec`'s arm on its cube with the pinch point `height_m` above the cube's centre
    (the fingers on its top part) and lifts `lift_m`: a grip off the centre, as a learner
    makes."""
    expert = ReactiveExpert(cell.model)
    cell.reset(robot.HOME, spec.objects)
    expert.reset(cell, spec)
    centre = np.asarray(cell.object_pose(spec.target).position, np.float64)
    waypoints = expert.config.waypoints
    steps = (
        (height_m + 0.05, waypoints.gripper_open, 2.0),
        (height_m, waypoints.gripper_open, 1.5),
        (height_m, waypoints.gripper_closed, 0.8),
        (height_m + lift_m, waypoints.gripper_closed, 0.8),
    )
    for height, gripper, seconds in steps:
        target = centre + np.array((0.0, 0.0, height))
        for _ in range(round(seconds / CONTROL_DT)):
            cell.set_targets(expert.steer(cell, target, gripper))
            cell.step(CONTROL_DT)
