"""ROS-free perception modules (what a perception node runs on its camera images)."""
