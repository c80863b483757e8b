"""The GPU host's side of the offline bundle (copied into it as install.py; stdlib only).

`bash DIR/run [gpu_bench arguments]` runs this with the host's Python (PYTHON, default python3):
1. checks that this Python is one the bundle carries wheels for and that the host has every
   distribution the manifest expects from it (JAX, PyTorch, transformers, ...): a JAX already on
   the host is used as it is;
2. unpacks the wheels (wheels.tar.xz) into a scratch directory (OXYGEN_SCRATCH, default a new
   temporary directory) and checks each against the manifest's sha256;
3. installs, with no package index and no dependency resolution, the `always` wheels and the
   `if-missing` wheels whose distribution the host lacks: `pip install --no-index --no-deps
   --target SCRATCH/site`;
4. prints where each key module comes from, then replaces itself with
   `python -P DIR/benchmarks/gpu_bench.py ARGS` with SCRATCH/site first on PYTHONPATH (so the
   bundle's pinned versions shadow the host's) and the JAX compilation cache in SCRATCH.
Exit status 2 (with the reason on stderr) when the host cannot run the bundle.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
# Modules whose origin the run reports (and the offline test checks).
REPORTED = (
    "jax",
    "jaxlib",
    "flax",
    "orbax.checkpoint",
    "jaxtyping",
    "openpi",
    "oxygen_ros.engine",
    "torch",
    "transformers",
)


def fail(message: str) -> None:
    print(f"gpu bundle: {message}", file=sys.stderr)
    raise SystemExit(2)


def has_distribution(name: str) -> str | None:
    """The host's installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def choose_wheels(manifest: dict, python: str) -> tuple[list[dict], list[str]]:
    """(wheels to install, lines saying what the host provides instead)."""
    chosen, notes = [], []
    for wheel in manifest["wheels"]:
        if python not in wheel["pythons"]:
            continue
        host_version = has_distribution(wheel["name"])
        if wheel["policy"] == "if-missing" and host_version is not None:
            notes.append(f"{wheel['name']} {host_version} (host; bundle has {wheel['version']})")
            continue
        chosen.append(wheel)
    return chosen, notes


def unpack(manifest: dict, wheels: list[dict], dest: pathlib.Path) -> None:
    """The chosen wheels out of the archive into dest/wheels, each checked by its sha256."""
    archive = HERE / manifest["archive"]
    if not archive.is_file() or sha256(archive) != manifest["archive_sha256"]:
        fail(f"{archive} is missing or differs from the manifest's sha256")
    wanted = {f"wheels/{w['file']}" for w in wheels}
    with tarfile.open(archive, "r:xz") as tar:
        members = [m for m in tar.getmembers() if m.name in wanted and m.isfile()]
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, members=members, filter="data")
        else:
            tar.extractall(dest, members=members)  # members: regular files named above
    for wheel in wheels:
        path = dest / "wheels" / wheel["file"]
        if not path.is_file() or sha256(path) != wheel["sha256"]:
            fail(f"{wheel['file']} is missing from the archive or differs from the manifest")


def install(wheels: list[dict], wheel_dir: pathlib.Path, site: pathlib.Path) -> None:
    site.mkdir(parents=True, exist_ok=True)
    files = [str(wheel_dir / w["file"]) for w in wheels]
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    cmd += ["--no-index", "--no-deps", "--upgrade", "--target", str(site), *files]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        fail(f"pip install failed:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")


def report_origins(env: dict[str, str]) -> None:
    """One line per key module: version and file, as the benchmark will import them."""
    code = (
        "import importlib, sys\n"
        f"for name in {REPORTED!r}:\n"
        "    module = importlib.import_module(name)\n"
        "    version = getattr(module, '__version__', '-')\n"
        "    print(f'  {name} {version} {module.__file__}')\n"
    )
    proc = subprocess.run([sys.executable, "-P", "-c", code], env=env, text=True)
    if proc.returncode != 0:
        fail("a module the benchmark needs does not import (see above)")


def main(argv: list[str]) -> None:
    manifest = json.loads((HERE / "manifest.json").read_text())
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python not in manifest["pythons"]:
        fail(f"Python {python} is not one this bundle carries wheels for: {manifest['pythons']}")
    absent = [name for name in manifest["host_provides"] if has_distribution(name) is None]
    if absent:
        fail(f"the host lacks what the bundle expects it to have: {', '.join(absent)}")
    wheels, notes = choose_wheels(manifest, python)
    scratch = pathlib.Path(
        os.environ.get("OXYGEN_SCRATCH") or tempfile.mkdtemp(prefix="oxygen_gpu_")
    ).resolve()
    unpack(manifest, wheels, scratch)
    site = scratch / "site"
    install(wheels, scratch / "wheels", site)
    print(f"gpu bundle: installed {len(wheels)} wheels into {site} (Python {python})")
    for note in notes:
        print(f"  from the host: {note}")

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(scratch / "jax_cache"))
    env.setdefault("PYTHONUNBUFFERED", "1")
    print("gpu bundle: modules the benchmark imports:")
    sys.stdout.flush()
    report_origins(env)
    entry = HERE / manifest["entry"]
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-P", str(entry), *argv], env)


if __name__ == "__main__":
    main(sys.argv[1:])
