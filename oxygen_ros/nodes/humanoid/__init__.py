"""The humanoid's synthetic sensors (`sim_sensors_node`): camera images and joint states."""
