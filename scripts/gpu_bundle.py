"""Builds the offline bundle for a GPU host: `scripts/gpu_bundle DIR`.

A GPU host used for benchmarks often reaches no package registry. The bundle carries, as wheels
for the host's Python (3.11 and 3.12 by default), everything the engine and `benchmarks/gpu`
import beyond what the host must already have (`HOST_PROVIDES`: a CUDA JAX with numpy and
scipy, and PyTorch and transformers, which openpi's JAX modules import at module level and which
are far too large to carry), plus the engine wheel built from setup.py, the benchmark's files,
a manifest and the host-side installer (`run`, `install.py`: `scripts/gpu_host_run.py`).

Every carried distribution is pinned to its version in requirements.lock (the versions the
tests run with) and has a policy:
- `always`: installed from the bundle even where the host has another version, because that
  version is what the engine needs (openpi itself; jaxtyping 0.2.x, since 0.3 breaks openpi's
  import; orbax-checkpoint 0.11.21, since 0.11.22 breaks openpi's `restore_params`);
- `if-missing`: installed only where the host has no distribution of that name. A host's JAX
  comes with the flax, optax, chex and tensorstore built for it (flax 0.12.8 does not import on
  JAX 0.11), so those are the host's when it has them.
`--host-has FILE` (names, or a `pip list --format=freeze` of the target host) leaves out the
`if-missing` wheels the host is known to have; the manifest then lists them as expected from
the host, and the installer refuses to run where one is absent.

Layout of DIR: run, install.py, manifest.json, wheels.tar.xz (the wheels, stored uncompressed
and then compressed together: 36 MiB instead of 71 for both Pythons), benchmarks/*.py. On the host:
`bash DIR/run [gpu_bench arguments]` (PYTHON=... picks the interpreter).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import lzma
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_host_run import sha256  # noqa: E402  (the host side checks with the same digest)

LOCK = ROOT / "requirements.lock"
MAX_BYTES = 64 * 2**20  # what one call to the GPU host may carry
PYTHONS = ("3.11", "3.12")
# manylinux tags pip should accept for an x86-64 Linux host with glibc >= 2.28.
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)

# What the host must have (distribution names): JAX with its accelerator plugin
# and what JAX itself needs, PyTorch and transformers (openpi imports both at module level),
# and their own dependencies. The offline-install test builds a host of exactly these.
HOST_PROVIDES = (
    "jax",
    "jaxlib",
    "numpy",
    "scipy",
    "ml_dtypes",
    "opt_einsum",
    "torch",
    "transformers",
    # PyTorch's and transformers' own dependencies (present wherever those two import).
    "filelock",
    "fsspec",
    "sympy",
    "mpmath",
    "networkx",
    "Jinja2",
    "MarkupSafe",
    "typing_extensions",
    "huggingface_hub",
    "hf-xet",
    "tokenizers",
    "safetensors",
    "regex",
    "requests",
    "charset-normalizer",
    "idna",
    "urllib3",
    "certifi",
    "PyYAML",
    "tqdm",
    "packaging",
)

ALWAYS, IF_MISSING = "always", "if-missing"
# What the bundle carries: the import closure of oxygen_ros.engine and benchmarks/gpu_bench.py
# (and its files) beyond HOST_PROVIDES, found by running the benchmark from a host that has
# only HOST_PROVIDES (test/test_gpu_bundle.py fails if anything is missing).
BUNDLED = {
    # openpi's JAX model code and what it imports.
    "rpent-openpi": ALWAYS,
    "openpi-client": ALWAYS,
    "jaxtyping": ALWAYS,
    "wadler_lindig": IF_MISSING,
    "beartype": ALWAYS,
    "augmax": ALWAYS,
    "einops": IF_MISSING,
    "numpydantic": ALWAYS,
    "pydantic": IF_MISSING,
    "pydantic_core": IF_MISSING,
    "annotated-types": IF_MISSING,
    "typing-inspection": IF_MISSING,
    "tqdm-loggable": ALWAYS,
    "pillow": IF_MISSING,  # openpi_client.image_tools
    "pytest": IF_MISSING,  # openpi.models_pytorch.gemma_pytorch imports it at module level
    "pluggy": IF_MISSING,
    "iniconfig": IF_MISSING,
    # Built for the host's JAX where it has them.
    "flax": IF_MISSING,
    "optax": IF_MISSING,
    "chex": IF_MISSING,
    "orbax-checkpoint": ALWAYS,
    "tensorstore": IF_MISSING,
    # flax's, orbax's and chex's own dependencies.
    "absl-py": IF_MISSING,
    "toolz": IF_MISSING,
    "treescope": IF_MISSING,
    "rich": IF_MISSING,
    "markdown-it-py": IF_MISSING,
    "mdurl": IF_MISSING,
    "Pygments": IF_MISSING,
    "msgpack": IF_MISSING,
    "etils": IF_MISSING,
    "zipp": IF_MISSING,
    "humanize": IF_MISSING,
    "nest-asyncio": IF_MISSING,
    "simplejson": IF_MISSING,
    "aiofiles": IF_MISSING,
    "protobuf": IF_MISSING,
    # The engine's tokenizer and the benchmark's memory probe.
    "sentencepiece": IF_MISSING,
    "psutil": IF_MISSING,
}
ARCHIVE = "wheels.tar.xz"
ARCHIVE_FORMAT = 2  # of write_archive's cached stream: a change invalidates the cache
CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / (
    "oxygen_ros/gpu_bundle"
)
LZMA_PRESET = 2  # 40 s for both Pythons on 2 cores; preset 6 saves 4 MiB more in 2 min
ENGINE_DIST = "oxygen-ros-engine"  # setup.py's wheel: oxygen_ros.engine only
# benchmarks/gpu_bench.py and the pieces it imports or loads from its own folder
# (test_gpu_bundle checks this is their closure).
BENCHMARK_FILES = (
    "gpu_bench.py",
    "gpu_bench_budget.py",
    "gpu_bench_report.py",
    "gpu_bench_run.py",
    "oxygen_bench.py",
    "oxygen_bench_components.py",
    "oxygen_bench_metrics.py",
    "oxygen_bench_protocol.py",
    "oxygen_bench_report.py",
    "openpi_equality.py",
    "roofline.py",
    "full_vocab.py",
)


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: pathlib.Path = LOCK) -> dict[str, str]:
    """requirements.lock as {canonical name: version}."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    return pins


def read_host_has(path: pathlib.Path | None) -> set[str]:
    """Canonical names in a host's package list (`name`, `name==1.2` or `name 1.2` lines)."""
    if path is None:
        return set()
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(canonical(re.split(r"[\s=<>!~@]", line, maxsplit=1)[0]))
    return names


def _run(cmd: list[str], **kwargs: object) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if proc.returncode != 0:
        raise SystemExit(f"gpu_bundle: {' '.join(cmd[:6])} ... failed:\n{proc.stderr[-3000:]}")


def download(requirements: list[str], python: str, dest: pathlib.Path) -> list[pathlib.Path]:
    """Binary wheels of `requirements` (no dependencies) for CPython `python` on x86-64 Linux."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for tag in PLATFORMS for arg in ("--platform", tag)]
    _run(
        [
            sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
            "--no-deps", "--only-binary=:all:", "--implementation", "cp",
            "--python-version", python, *platforms, "-d", str(dest), *requirements,
        ]
    )  # fmt: skip
    return sorted(dest.glob("*.whl"))


def build_engine_wheel(dest: pathlib.Path) -> pathlib.Path:
    """setup.py's engine-only wheel, built from a copy (setuptools writes next to setup.py).

    Without an isolated build where this Python's setuptools can build wheels itself (the
    project's venv), else pip fetches setuptools into an isolated build environment.
    """
    probe = subprocess.run(
        [sys.executable, "-c", "import setuptools.command.bdist_wheel"], capture_output=True
    )
    isolation = "--no-build-isolation" if probe.returncode == 0 else "--use-pep517"
    with tempfile.TemporaryDirectory(prefix="engine_wheel_") as tmp:
        src = pathlib.Path(tmp) / "src"
        shutil.copytree(
            ROOT / "oxygen_ros", src / "oxygen_ros", ignore=shutil.ignore_patterns("__pycache__")
        )
        shutil.copy2(ROOT / "setup.py", src / "setup.py")
        _run(
            [
                sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check",
                "--no-deps", isolation, "-w", str(dest), str(src),
            ],
            cwd=tmp,
        )  # fmt: skip
    (wheel,) = dest.glob("oxygen_ros_engine-*.whl")
    return wheel


def _dist_of(wheel: str) -> tuple[str, str]:
    """(canonical name, version) from a wheel's file name."""
    name, version = wheel.split("-")[:2]
    return canonical(name), version


def store_uncompressed(wheel: pathlib.Path, dest: pathlib.Path) -> None:
    """The same wheel with its members stored, not deflated (RECORD hashes the members'
    contents, so it stays a valid wheel): LZMA then compresses the binaries far better than
    deflate did, and finds what the cp311 and cp312 builds of a package share."""
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(dest, "w", zipfile.ZIP_STORED) as zout:
        for member in zin.infolist():
            info = zipfile.ZipInfo(member.filename, date_time=member.date_time)
            info.external_attr = member.external_attr
            zout.writestr(info, zin.read(member), compress_type=zipfile.ZIP_STORED)


def _tar_member(stage: pathlib.Path, file: str) -> bytes:
    """One regular file of a ustar/pax archive as `wheels/<file>`: header, data, padding."""
    data = (stage / file).read_bytes()
    info = tarfile.TarInfo(f"wheels/{file}")
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    header = info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    return header + data + bytes(-len(data) % tarfile.BLOCKSIZE)


def _xz_stream(members: list[bytes], dict_size: int) -> bytes:
    filters = [{"id": lzma.FILTER_LZMA2, "preset": LZMA_PRESET, "dict_size": dict_size}]
    compressor = lzma.LZMACompressor(format=lzma.FORMAT_XZ, filters=filters)
    return b"".join([*(compressor.compress(m) for m in members), compressor.flush()])


def write_archive(
    stage: pathlib.Path,
    digests: dict[str, str],
    path: pathlib.Path,
    fresh: set[str] = frozenset(),
    cache: pathlib.Path | None = None,
) -> bool:
    """The files of `stage` named in `digests` (file -> sha256, as build() computed them) as one
    tar in name order (a package's builds side by side), xz with a dictionary larger than the
    largest stored wheel so the second build costs little.

    The archive is two concatenated xz streams (one tar to any xz reader): the wheels not in
    `fresh` and then those in `fresh` (the engine wheel, which changes with the source) with the
    tar's end. Compressing the first costs about 40 s; it depends only on those wheels' bytes,
    so `cache` keeps it by their digests. Returns whether it came from the cache."""
    files = sorted(digests)
    kept = [f for f in files if f not in fresh]
    largest = max((stage / f).stat().st_size for f in kept)
    dict_size = min(max(1 << 26, 1 << (largest - 1).bit_length()), 1 << 28)
    identity = [[f, digests[f]] for f in kept]
    key = hashlib.sha256(json.dumps([ARCHIVE_FORMAT, LZMA_PRESET, dict_size, identity]).encode())
    cached = cache / f"{key.hexdigest()}.xz" if cache is not None else None
    hit = cached is not None and cached.is_file()
    if hit:
        head = cached.read_bytes()
    else:
        head = _xz_stream([_tar_member(stage, f) for f in kept], dict_size)
        if cached is not None:
            cache.mkdir(parents=True, exist_ok=True)
            partial = cached.with_suffix(f".{os.getpid()}.part")
            partial.write_bytes(head)
            partial.replace(cached)  # atomic: a reader sees all of it or nothing
            _prune(cache, keep=cached)
    tail = [_tar_member(stage, f) for f in files if f in fresh] + [bytes(2 * tarfile.BLOCKSIZE)]
    path.write_bytes(head + _xz_stream(tail, 1 << 20))
    return hit


def _prune(cache: pathlib.Path, keep: pathlib.Path, entries: int = 3) -> None:
    """At most `entries` archives in the cache (the newest; `keep` among them)."""
    old = sorted(cache.glob("*.xz"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in [p for p in old if p != keep][entries - 1 :]:
        stale.unlink(missing_ok=True)


def _git_commit() -> str | None:
    proc = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def carried_for(host_has: set[str]) -> dict[str, str]:
    """BUNDLED less the if-missing distributions the host is known to have."""
    return {
        name: policy
        for name, policy in BUNDLED.items()
        if not (policy == IF_MISSING and canonical(name) in host_has)
    }


def build(
    out: pathlib.Path, pythons: list[str], host_has: set[str], cache: pathlib.Path | None = CACHE
) -> dict[str, object]:
    """Writes the bundle into `out` (emptied first); returns its manifest. `cache` keeps the
    compressed dependency wheels for the next build (None: compress them anyway)."""
    pins = read_lock()
    missing = [name for name in BUNDLED if canonical(name) not in pins]
    if missing:
        raise SystemExit(f"gpu_bundle: not pinned in requirements.lock: {missing}")
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    carried = carried_for(host_has)
    requirements = [f"{name}=={pins[canonical(name)]}" for name in carried]

    serves: dict[str, set[str]] = {}  # wheel file -> Pythons it was downloaded for
    source_sha: dict[str, str] = {}  # wheel file -> sha256 as downloaded (PyPI's file)
    with tempfile.TemporaryDirectory(prefix="gpu_bundle_") as tmp:
        stage = pathlib.Path(tmp) / "wheels"
        stage.mkdir()
        downloaded = []
        for python in pythons:
            for wheel in download(requirements, python, pathlib.Path(tmp) / python):
                serves.setdefault(wheel.name, set()).add(python)
                downloaded.append(wheel)
        engine = build_engine_wheel(pathlib.Path(tmp) / "engine")
        serves[engine.name] = set(pythons)
        for wheel in [*downloaded, engine]:
            if wheel.name not in source_sha:
                source_sha[wheel.name] = sha256(wheel)
                store_uncompressed(wheel, stage / wheel.name)
        stored = {f: (sha256(stage / f), (stage / f).stat().st_size) for f in serves}
        digests = {f: digest for f, (digest, _) in stored.items()}
        cached = write_archive(stage, digests, out / ARCHIVE, {engine.name}, cache)

    bench_dir = out / "benchmarks"
    bench_dir.mkdir()
    for name in BENCHMARK_FILES:
        shutil.copy2(ROOT / "benchmarks" / name, bench_dir / name)
    shutil.copy2(ROOT / "scripts" / "gpu_host_run.py", out / "install.py")
    run = out / "run"
    run.write_text(RUN_SCRIPT)
    run.chmod(0o755)

    policies = {canonical(name): policy for name, policy in carried.items()}
    policies[canonical(ENGINE_DIST)] = ALWAYS
    wheels = []
    for file in sorted(serves):
        name, version = _dist_of(file)
        wheels.append(
            {
                "file": file,
                "name": name,
                "version": version,
                "pythons": sorted(serves[file]),
                "policy": policies[name],
                "bytes": stored[file][1],  # as carried: the same wheel, stored uncompressed
                "sha256": stored[file][0],
                "source_sha256": source_sha[file],  # the wheel as the registry serves it
            }
        )
    # Each carried distribution has exactly one wheel per Python (two would stop pip).
    for python in pythons:
        names = [w["name"] for w in wheels if python in w["pythons"]]
        expected = sorted(policies)
        if sorted(names) != expected:
            raise SystemExit(f"gpu_bundle: Python {python} wheels {sorted(names)} != {expected}")
    expected_from_host = sorted(
        set(HOST_PROVIDES) | {n for n, p in BUNDLED.items() if n not in carried}
    )
    manifest = {
        "bundle": "oxygen_ros gpu_bundle",
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": _git_commit(),
        "pythons": pythons,
        "platforms": list(PLATFORMS),
        # Distributions the host must have, and the versions the offline test's host had.
        "host_provides": expected_from_host,
        "host_provides_tested": {n: pins.get(canonical(n)) for n in expected_from_host},
        "wheels": wheels,
        "archive": ARCHIVE,
        "archive_sha256": sha256(out / ARCHIVE),
        "archive_head_cached": cached,  # the dependency wheels' stream came from the cache
        "benchmark_files": list(BENCHMARK_FILES),
        "entry": "benchmarks/gpu_bench.py",
    }
    others = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    manifest["total_bytes"] = 0
    for _ in range(3):  # the manifest counts itself: settle the number's own digits
        text = json.dumps(manifest, indent=2) + "\n"
        manifest["total_bytes"] = others + len(text.encode())
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


RUN_SCRIPT = """\
#!/usr/bin/env bash
# Installs this bundle with no package index into a scratch directory and runs
# benchmarks/gpu_bench.py with the host's JAX; arguments go to gpu_bench.py.
# PYTHON (default python3) picks the interpreter; OXYGEN_SCRATCH the scratch directory.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
exec "${PYTHON:-python3}" "$HERE/install.py" "$@"
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=pathlib.Path, help="bundle directory (emptied first)")
    parser.add_argument(
        "--python",
        action="append",
        dest="pythons",
        choices=("3.10", "3.11", "3.12", "3.13"),
        help="a host Python to carry wheels for (repeatable; default 3.11 and 3.12)",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help=f"compress the dependency wheels even where {CACHE} holds them",
    )
    parser.add_argument(
        "--host-has",
        type=pathlib.Path,
        default=None,
        help="the target host's package names (or `pip list --format=freeze`): its "
        "if-missing wheels are left out and expected from the host",
    )
    args = parser.parse_args(argv)
    args.pythons = sorted(set(args.pythons or PYTHONS))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cache = None if args.no_cache else CACHE
    manifest = build(args.out.resolve(), args.pythons, read_host_has(args.host_has), cache)
    total = int(manifest["total_bytes"])  # type: ignore[call-overload]
    wheels = manifest["wheels"]
    assert isinstance(wheels, list)
    print(
        f"gpu_bundle: {len(wheels)} wheels for Python {', '.join(args.pythons)}, "
        f"{total / 2**20:.1f} MiB in {args.out}"
    )
    if total > MAX_BYTES:
        print(f"gpu_bundle: over {MAX_BYTES // 2**20} MiB", file=sys.stderr)
        return 1
    print(f"on the GPU host: bash {args.out}/run --budget-s 420 --out gpu_bench_pi05.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
