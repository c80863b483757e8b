"""Training diagnostics (ROS-free): one-off probes of a checkpoint or of what behaviour cloning
needs, each runnable as `python -m oxygen_ros.training.diagnostics.<name>` (see its docstring).

- `first_frame`: what a checkpoint says and which arm it moves at the first frame of held-out
  episodes;
- `state_probe`: whether a checkpoint's chunks depend on the state written in its prompt;
- `learner_vs_expert`: where a checkpoint's own episodes depart from the reactive expert;
- `state_policy`, `privileged_policy` (with `mlp_policy`): an MLP on the state as numbers, on
  the demonstrations, with what the expert's law reads;
- `prefix_head`, `untrained_checkpoint`: an MLP on a checkpoint's prefix cache, and the
  untrained prefix as its control;
- `train_step`: one training step's cost per preset and number of action draws.

docs/TRAINING.md says what each found.
"""
