"""The inference node (`inference_node`): the engine thread, the action publisher's process,
language requests, instructions and the Instruct action, memory."""
