"""package:// URIs resolve to the installed share directory or, for this package, the
source tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oxygen_ros.resources import SOURCE_ROOT, cache_dir, resolve_path


def test_plain_paths_pass_through_with_home_expanded() -> None:
    assert resolve_path("") == ""
    assert resolve_path("/tmp/x") == "/tmp/x"
    assert resolve_path("~/ckpt") == os.path.expanduser("~/ckpt")


def test_package_uri_names_a_shipped_file() -> None:
    resolved = Path(resolve_path("package://oxygen_ros/config/workcell.yaml"))
    assert resolved.is_file()
    assert resolved.read_bytes() == (SOURCE_ROOT / "config" / "workcell.yaml").read_bytes()


def test_bad_uris_are_refused() -> None:
    with pytest.raises(ValueError, match="expected package://<package>/<path>"):
        resolve_path("package://oxygen_ros")
    with pytest.raises(ValueError, match="is not installed"):
        resolve_path("package://no_such_package_here/x")


def test_cache_dirs_follow_xdg_cache_home(monkeypatch, tmp_path: Path) -> None:
    from oxygen_ros import supervisor

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    assert cache_dir("jax") == tmp_path / "oxygen_ros" / "jax"
    assert supervisor.node_env()["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "oxygen_ros/jax")
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")  # a user's choice stays
    assert supervisor.node_env()["JAX_COMPILATION_CACHE_DIR"] == "/elsewhere"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir("jax") == Path.home() / ".cache" / "oxygen_ros" / "jax"
