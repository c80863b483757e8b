"""rosbag2 (MCAP) bags of the graph's topics: message definitions, writing, reading and
replay timing (ROS-free)."""
