"""Training the engine's pi0.5 model on workcell demonstrations (ROS-free, like the engine).

- `data`: recorded HDF5 episodes -> model-ready samples, tokenised as the engine serves them;
- `loss`: openpi's flow-matching action loss + language cross-entropy, laid out as the engine
  serves them (a prefix pass, then the action expert on its cache);
- `train`: optimiser, evaluation on held-out episodes, curves, openpi-layout checkpoint.
"""
