"""The recorder node (`recorder_node`): the graph's topics into a rosbag2 MCAP bag."""
