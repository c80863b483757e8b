"""ROS 2 nodes of oxygen_ros and the pure modules they are built from (see docs/NODES.md)."""
