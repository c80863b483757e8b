"""The perception node (`perception_node`): cameras and joint states fused into ObservationFrames
at the model's image resolution."""
