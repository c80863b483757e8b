"""The workcell's nodes: the ALOHA workcell simulator (`workcell_sim_node`) and the scripted
expert (`expert_node`) with its demonstration recording."""
