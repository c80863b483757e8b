# Source this file (bash) to use the project's venv and install space:
#   source scripts/env.sh
# It sets what `source install/setup.bash` would on a real ROS 2 install, plus the test
# defaults (LOCALHOST discovery, a log dir) unless already set.
_oxygen_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_oxygen_build="${OXYGEN_BUILD_DIR:-$_oxygen_root/.build}"
export VIRTUAL_ENV="$_oxygen_build/venv"
export PATH="$VIRTUAL_ENV/bin:$PATH"
export AMENT_PREFIX_PATH="$VIRTUAL_ENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export COLCON_TRACE="${COLCON_TRACE:-}"
# colcon's setup scripts read unset variables: relax `set -u` while sourcing them.
case $- in *u*) _oxygen_nounset=1; set +u ;; *) _oxygen_nounset= ;; esac
# shellcheck disable=SC1091
source "$_oxygen_build/ws/install/local_setup.bash"
[ -n "$_oxygen_nounset" ] && set -u
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
export ROS_LOG_DIR="${ROS_LOG_DIR:-$_oxygen_build/ros_log}"
export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
unset _oxygen_root _oxygen_build _oxygen_nounset
# Headless MuJoCo rendering on the CPU (Mesa's EGL + llvmpipe); the workcell simulation needs it.
export MUJOCO_GL="${MUJOCO_GL:-egl}"
export PYOPENGL_PLATFORM="${PYOPENGL_PLATFORM:-egl}"
