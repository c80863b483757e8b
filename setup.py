"""Engine-only Python distribution `oxygen-ros-engine` (no ROS): `pip wheel --no-deps .`.

colcon does not use this file: oxygen_ros is an ament_cmake package (ROS 2 generates the
message types only through CMake, and CMakeLists.txt installs the hand-written modules next to
the generated `oxygen_ros.msg`). This file has one job: a wheel of the ROS-free engine,
`oxygen_ros.engine`, for GPU hosts and benchmarks that run the model without any ROS install.
Do not `pip install` it into the ROS environment: its `oxygen_ros` would shadow the generated
message package (test/test_setup_py.py builds the wheel and imports it in isolation).
"""

from setuptools import setup

setup(
    name="oxygen-ros-engine",
    version="0.1.0",
    description="pi0.5 multi-task engine with a unified KV cache (ROS-free part of oxygen_ros)",
    license="Apache-2.0",
    python_requires=">=3.10",
    # Only the engine: `oxygen_ros` stays a namespace so nodes/launch code is not shipped.
    packages=["oxygen_ros.engine"],
    package_data={"oxygen_ros.engine": ["assets/*"]},
    install_requires=[
        "jax>=0.5.3",
        "flax>=0.10.2",
        "numpy",
        "sentencepiece",
        "orbax-checkpoint",
    ],
)
