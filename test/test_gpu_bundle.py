"""scripts/gpu_bundle: the offline bundle for a GPU host, built here and installed with no index
into a fresh venv that holds only what the bundle expects a host to have (HOST_PROVIDES: JAX,
PyTorch, transformers and their own dependencies, at the lock's versions), from which the
benchmark's CPU smoke path runs. Nothing from the project's venv or source tree is reachable
from there, so a module the bundle lacks fails the run."""

from __future__ import annotations

import ast
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
from harness import JAX_TEST_CACHE

ROOT = Path(__file__).resolve().parents[1]
HOST_VENVS = JAX_TEST_CACHE.parent / "gpu_bundle_test_hosts"
LAST_LINE = re.compile(
    r"^gpu_bench device=cpu action_hz=(?P<hz>[0-9.]+) tokens_per_s=[0-9]+ "
    r"speedup_vs_isolated=(?P<speedup>[0-9.]+) chunk_every_143ms=(yes|no) openpi_equal=yes "
    r"complete=yes$"
)
STAGES = (
    "imports",
    "imports_engine",
    "peaks",
    "model",
    "equality",
    "components",
    "engines",
    "warmup_frames",
    "measured",
)


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gpu_bundle = _load("gpu_bundle")
host_run = _load("gpu_host_run")


def _base_python() -> str:
    """The interpreter the project's venv was made from (a venv made from a venv's python
    would still see nothing of it, but this keeps the fake host independent of it)."""
    return getattr(sys, "_base_executable", sys.executable)


def _venv(path: Path) -> Path:
    subprocess.run([_base_python(), "-m", "venv", str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def _bare_env(**extra: str) -> dict[str, str]:
    """No PYTHONPATH, venv, ROS or pip configuration of this machine's. The test run's XLA
    cache (test/conftest.py) holds executables, not modules: the smoke benchmark compiles what
    the last run compiled, with the same JAX."""
    cache = {
        k: v
        for k, v in os.environ.items()
        if k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))
    }
    return {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "PIP_CONFIG_FILE": os.devnull,
        "JAX_PLATFORMS": "cpu",
        "LANG": "C.UTF-8",
        **cache,
        **extra,
    }


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "gpu_bundle"
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu_bundle"), str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _freeze(python: Path) -> list[str]:
    """What a venv holds beyond pip itself, as `name==version`, sorted."""
    listing = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        env=_bare_env(),
        check=True,
    ).stdout.split()
    return sorted(line for line in listing if not line.startswith(("pip==", "setuptools==")))


@pytest.fixture(scope="module")
def host_python() -> Path:
    """A venv with exactly HOST_PROVIDES at the lock's versions (pip's usual sources:
    torch==2.13.0 is the CPU wheel on these machines' disk), without their dependencies.

    Deterministic, so kept between runs under the user's cache, by the pins and this Python
    (installing torch and jaxlib takes most of a minute): it is made once under a lock, and
    used again only while it holds exactly what it was made with (else made anew). The smoke
    test checks that a run leaves it as it was."""
    pins = gpu_bundle.read_lock()
    reqs = sorted(
        f"{name}=={pins[gpu_bundle.canonical(name)]}" for name in gpu_bundle.HOST_PROVIDES
    )
    key = hashlib.sha256(json.dumps([reqs, _base_python(), sys.version]).encode()).hexdigest()
    home = HOST_VENVS / key[:16]
    python = home / "venv" / "bin" / "python"
    HOST_VENVS.mkdir(parents=True, exist_ok=True)
    with (HOST_VENVS / f"{key[:16]}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run making the same venv: wait for it
        ready = home / "freeze.json"
        made = json.loads(ready.read_text()) if ready.is_file() and python.is_file() else None
        if made is not None and _freeze(python) == made:
            return python
        shutil.rmtree(home, ignore_errors=True)
        _venv(home / "venv")
        proc = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", *reqs],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        ready.write_text(json.dumps(_freeze(python)))
    return python


@pytest.mark.slow
def test_bundle_carries_both_pythons_under_64_mib(bundle: Path) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    files = [f for f in bundle.rglob("*") if f.is_file()]
    total = sum(f.stat().st_size for f in files)
    assert manifest["total_bytes"] == total
    assert total <= 64 * 2**20, total
    assert manifest["pythons"] == ["3.11", "3.12"]
    assert manifest["archive_sha256"] == gpu_bundle.sha256(bundle / manifest["archive"])
    pins = gpu_bundle.read_lock()
    expected = {gpu_bundle.canonical(n) for n in gpu_bundle.BUNDLED} | {"oxygen-ros-engine"}
    for python in ("3.11", "3.12"):
        carried = [w for w in manifest["wheels"] if python in w["pythons"]]
        assert sorted(w["name"] for w in carried) == sorted(expected)  # one wheel each
        for wheel in carried:
            if wheel["name"] != "oxygen-ros-engine":
                assert wheel["version"] == pins[wheel["name"]], wheel  # the tested versions
    policies = {w["name"]: w["policy"] for w in manifest["wheels"]}
    assert policies["jaxtyping"] == policies["rpent-openpi"] == "always"
    assert policies["flax"] == "if-missing"
    assert sorted(p.name for p in (bundle / "benchmarks").iterdir()) == sorted(
        gpu_bundle.BENCHMARK_FILES
    )
    assert set(manifest["host_provides"]) == set(gpu_bundle.HOST_PROVIDES)


@pytest.fixture(scope="module")
def smoke(bundle: Path, host_python: Path, tmp_path_factory: pytest.TempPathFactory):
    """One `--force-cpu-smoke` run of the bundle on the fake host, installed with no index (with
    a budget it keeps easily), for every test below: the GPU host's path, on which the
    benchmark's own checks are asserted too. Returns (the run, its JSON, its scratch dir)."""
    home = tmp_path_factory.mktemp("smoke")
    scratch, out = home / "scratch", home / "smoke.json"
    proc = subprocess.run(
        ["bash", str(bundle / "run"), "--force-cpu-smoke", "--budget-s", "600", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=home,
        env=_bare_env(PYTHON=str(host_python), OXYGEN_SCRATCH=str(scratch)),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc, out, scratch


@pytest.mark.slow
def test_installed_with_no_index_on_a_bare_host_the_smoke_benchmark_runs(
    smoke, host_python: Path, tmp_path: Path
) -> None:
    # Control: the fake host has JAX, PyTorch and transformers and none of what the bundle
    # brings, so a module the bundle lacked would have failed the run.
    probe = "import importlib.util as u; print([m for m in {mods!r} if u.find_spec(m)])"
    have = ["jax", "torch", "transformers", "flax", "openpi", "oxygen_ros", "einops", "PIL"]
    found = subprocess.run(
        [str(host_python), "-P", "-c", probe.format(mods=have)],
        capture_output=True,
        text=True,
        env=_bare_env(),
        cwd=tmp_path,
        check=True,
    ).stdout
    assert found.strip() == "['jax', 'torch', 'transformers']"

    proc, _, scratch = smoke
    origins = {
        m.group(1): m.group(2) for m in re.finditer(r"^  (\S+) \S+ (\S+)$", proc.stdout, re.M)
    }
    host_site = str(host_python.parents[1])
    for name in ("jax", "jaxlib", "torch", "transformers"):
        assert origins[name].startswith(host_site), (name, origins[name])
    for name in ("flax", "orbax.checkpoint", "jaxtyping", "openpi", "oxygen_ros.engine"):
        assert origins[name].startswith(str(scratch / "site")), (name, origins[name])
    assert not any(str(ROOT) in path for path in origins.values())
    # The bundle went to the scratch directory; the host's environment is as it was.
    assert _freeze(host_python) == json.loads((host_python.parents[2] / "freeze.json").read_text())


@pytest.mark.slow
def test_cpu_smoke_runs_the_comparison_and_ends_with_the_summary_line(smoke) -> None:
    proc, out, _ = smoke
    last = proc.stdout.strip().splitlines()[-1]
    assert (match := LAST_LINE.match(last)), last
    assert "device=cpu " in last
    document = json.loads(out.read_text())
    assert document["ran"] is True and document["smoke"] is True
    assert document["complete"] is True and document["incomplete_reason"] is None
    assert document["trimmed"] == []  # 600 s is plenty
    assert document["device"] == "cpu"
    assert document["model"]["preset"] == "tiny"
    assert document["setting"]["denoise_steps"] == 10 and document["setting"]["k"] == 5
    assert document["setting"]["frames"] == document["setting"]["frames_requested"] == 2
    methods = [r["method"] for r in document["results"]]
    assert methods == ["isolated", "shared_kv", "cb_k5", "deadline", "deadline_143ms"]
    for result in document["results"]:
        assert result["deterministic_lengths"], result["label"]  # every request decoded M
        assert result["compiles_after_warmup"] == 0, result["label"]
        assert result["action_path_ms_p99"] <= result["chunk_interval_ms_p99"] + 1e-6
    headline = document["headline"]
    assert headline["method"] == "cb_k5"
    assert headline["action_hz"] > 0 and headline["tokens_per_s"] > 0
    assert headline["speedup_vs_isolated"] > 0
    # The last line's speedup is the steady-state figure (the finite run's sits beside it).
    assert match["speedup"] == f"{headline['speedup_steady_vs_isolated']:.2f}"
    seventy = document["seventy_hz"]
    assert seventy["period_ms"] == pytest.approx(1e3 * 10 / 70)
    assert seventy["chunk_every_143ms"] == (seventy["chunk_interval_ms_p99"] <= 1e3 * 10 / 70)
    assert last.startswith("gpu_bench device=cpu ")
    assert f"chunk_every_143ms={'yes' if seventy['chunk_every_143ms'] else 'no'} " in last
    # The fake host has no matplotlib (the GPU hosts may not): no PNG, and the run says so
    # (the next test draws it here from the JSON).
    assert not out.with_suffix(".png").exists()
    assert f"matplotlib not importable: no {out.with_suffix('.png').name}" in proc.stdout


@pytest.mark.slow
def test_cpu_smoke_compares_the_timed_model_with_openpi(smoke) -> None:
    proc, out, _ = smoke
    document = json.loads(out.read_text())
    equality = document["openpi_equality"]
    assert document["openpi_equal"] is True and equality["openpi_equal"] is True
    assert equality["tolerance"] == 1e-5 and "float32" in equality["tolerance_rule"]
    assert equality["max_abs_diff"] <= 1e-5
    assert len(equality["max_abs_diff_per_observation"]) == equality["observations"] == 2
    # Another observation moves the chunk far beyond the tolerance: equality is meaningful.
    assert equality["observation_dependence"] > 0.05
    assert equality["meaningful"] is True and equality["dependence_over_tolerance"] > 1e3
    # The timed model is the compared one: its zero leaves perturbed, the tiny preset's tower.
    assert document["model"]["perturbed_zero_leaves"] > 0
    assert equality["vision_variant"] == document["model"]["vision_variant"] == "mu/14"
    assert "mu/14 tower" in equality["openpi_model"]
    assert "openpi equality (float32): equal" in proc.stdout


@pytest.mark.slow
def test_cpu_smoke_names_its_versions_and_stage_times(smoke) -> None:
    _, out, _ = smoke
    document = json.loads(out.read_text())
    assert document["jax"] == importlib.metadata.version("jax")
    assert document["jaxlib"] == importlib.metadata.version("jaxlib")
    assert document["python"] == platform.python_version()
    assert document["device_platform"] == "cpu"
    stages = document["stages"]
    assert list(stages) == [*STAGES, "total"]
    for name in STAGES:
        assert stages[name]["wall_s"] > 0, name
        assert "interrupted" not in stages[name], name
    # Stages do not overlap and run within the process's own time.
    assert sum(stages[name]["wall_s"] for name in STAGES) <= stages["total"]["wall_s"] + 1e-3
    assert stages["total"]["wall_s"] <= document["wall_s"] + 1e-3
    for name in ("model", "equality", "components"):  # compiled (or loaded from the cache)
        assert stages[name]["xla_compiles"] > 0, name
    for name in ("warmup_frames", "measured"):  # engines warmed up: no compilation
        assert stages[name]["xla_compiles"] == 0, name
    total = stages["total"]
    assert total["xla_compiles"] == sum(stages[name]["xla_compiles"] for name in STAGES)
    assert total["backend_compile_s"] > 0 and total["trace_s"] > 0


@pytest.mark.slow
def test_plot_from_draws_the_png_of_a_json(smoke, tmp_path: Path) -> None:
    _, out, _ = smoke
    copy = tmp_path / "copied.json"
    shutil.copyfile(out, copy)
    proc = subprocess.run(
        [sys.executable, "-P", str(ROOT / "benchmarks/gpu_bench.py"), "--plot-from", str(copy)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert copy.with_suffix(".png").stat().st_size > 1000
    assert proc.stdout.strip().splitlines()[-1] == f"plot: {copy.with_suffix('.png')}"


@pytest.mark.slow
def test_a_host_without_jax_is_refused_with_the_reason(bundle: Path, tmp_path: Path) -> None:
    python = _venv(tmp_path / "empty")
    proc = subprocess.run(
        ["bash", str(bundle / "run"), "--force-cpu-smoke"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_bare_env(PYTHON=str(python), OXYGEN_SCRATCH=str(tmp_path / "scratch")),
    )
    assert proc.returncode == 2
    reason = "gpu bundle: the host lacks what the bundle expects it to have: "
    assert proc.stderr.startswith(reason), proc.stderr
    absent = proc.stderr.removeprefix(reason).strip().split(", ")
    assert {"jax", "jaxlib", "torch", "transformers"} <= set(absent)
    assert not (tmp_path / "scratch").exists()  # refused before anything was unpacked


def test_the_bundle_carries_every_module_beside_gpu_bench_that_it_loads() -> None:
    """BENCHMARK_FILES is the closure of benchmarks/gpu_bench.py over the benchmarks/ modules
    it imports or loads by name (`load_module("...")`): a piece left out would fail only on
    the host (the slow test above runs the bundle)."""
    bench = ROOT / "benchmarks"
    local = {path.stem for path in bench.glob("*.py")}
    seen: set[str] = set()
    todo = ["gpu_bench"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in ast.walk(ast.parse((bench / f"{name}.py").read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "load_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                names = [str(node.args[0].value)]
            else:
                continue
            todo += [n for n in names if n in local]
    assert sorted(f"{name}.py" for name in seen) == sorted(gpu_bundle.BENCHMARK_FILES)


def _manifest(*wheels: tuple[str, str, list[str]]) -> dict:
    return {
        "wheels": [
            {"file": f"{n}.whl", "name": n, "version": "1", "pythons": p, "policy": policy}
            for n, policy, p in wheels
        ]
    }


def test_if_missing_wheels_give_way_to_the_hosts_and_always_wheels_do_not() -> None:
    # pytest and pluggy are installed in this interpreter, no-such-dist is not.
    manifest = _manifest(
        ("pytest", "if-missing", ["3.11", "3.12"]),
        ("pluggy", "always", ["3.11", "3.12"]),
        ("no-such-dist", "if-missing", ["3.11", "3.12"]),
        ("only-for-other-python", "always", ["3.9"]),
    )
    chosen, notes = host_run.choose_wheels(
        manifest, f"{sys.version_info[0]}.{sys.version_info[1]}"
    )
    assert [w["name"] for w in chosen] == ["pluggy", "no-such-dist"]
    assert len(notes) == 1 and notes[0].startswith("pytest ")


def test_host_has_leaves_out_only_if_missing_wheels(tmp_path: Path) -> None:
    listing = tmp_path / "host.txt"
    listing.write_text(
        "# pip list --format=freeze\nflax==0.12.10\ntensorstore 0.1.90\njaxtyping\n"
    )
    host_has = gpu_bundle.read_host_has(listing)
    assert host_has == {"flax", "tensorstore", "jaxtyping"}
    carried = gpu_bundle.carried_for(host_has)
    assert "flax" not in carried and "tensorstore" not in carried
    assert carried["jaxtyping"] == "always"  # the host's jaxtyping 0.3 breaks openpi
    assert set(gpu_bundle.carried_for(set())) == set(gpu_bundle.BUNDLED)


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive, "r:xz") as tar:  # the host's reader (gpu_host_run)
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_the_archive_reuses_the_cached_dependencies_only_while_their_bytes_are_the_same(
    tmp_path: Path,
) -> None:
    stage, cache = tmp_path / "stage", tmp_path / "cache"
    stage.mkdir()
    files = {"a-1-py3-none-any.whl": b"a" * 5000, "b-2-py3-none-any.whl": os.urandom(3000)}
    files["oxygen_ros_engine-0-py3-none-any.whl"] = b"engine v1"
    for name, data in files.items():
        (stage / name).write_bytes(data)
    engine = {"oxygen_ros_engine-0-py3-none-any.whl"}

    def write(out: str) -> tuple[bool, dict[str, bytes]]:
        digests = {name: gpu_bundle.sha256(stage / name) for name in files}
        hit = gpu_bundle.write_archive(stage, digests, tmp_path / out, engine, cache)
        return hit, _members(tmp_path / out)

    expected = {f"wheels/{name}": data for name, data in files.items()}
    assert write("first.tar.xz") == (False, expected)  # compressed and kept
    assert write("second.tar.xz") == (True, expected)  # from the cache
    # The engine wheel changed: the dependencies still come from the cache, with the new engine.
    files["oxygen_ros_engine-0-py3-none-any.whl"] = b"engine v2"
    (stage / "oxygen_ros_engine-0-py3-none-any.whl").write_bytes(b"engine v2")
    expected["wheels/oxygen_ros_engine-0-py3-none-any.whl"] = b"engine v2"
    assert write("third.tar.xz") == (True, expected)
    # A dependency changed: compressed again (control: the cache is keyed by the bytes).
    (stage / "a-1-py3-none-any.whl").write_bytes(b"A" * 5000)
    expected["wheels/a-1-py3-none-any.whl"] = b"A" * 5000
    assert write("fourth.tar.xz") == (False, expected)
    # Without a cache it is the same archive.
    digests = {name: gpu_bundle.sha256(stage / name) for name in files}
    hit = gpu_bundle.write_archive(stage, digests, tmp_path / "plain.tar.xz", engine, None)
    assert not hit and _members(tmp_path / "plain.tar.xz") == expected
    assert len(list(cache.glob("*.xz"))) == 2
