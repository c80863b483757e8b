"""package:// URIs resolve to the installed share directory or, for this package, the
source tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oxygen_ros.resources import SOURCE_ROOT, resolve_path


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
