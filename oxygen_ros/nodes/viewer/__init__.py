"""The live view (`viewer_node`): the graph in a browser, through Rerun's web viewer."""
