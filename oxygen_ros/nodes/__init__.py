"""ROS 2 nodes of oxygen_ros and the pure modules they are built from (see docs/NODES.md), one
package per node: `inference`, `perception`, `workcell` (the simulator and the scripted
expert), `humanoid` (synthetic sensors); `common` holds what several of them share."""
