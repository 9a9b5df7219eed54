"""What the architecture tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for a test module, as a site keeps one. A test's first build of a model is
    cold (each test builds its own model or target); a second build of the same structure is a
    hit, as it would be at a site: tests/conftest.py's numpy rerun then runs the module the first
    run built, with the native library withheld (the build does not depend on the library:
    tests/device_targets/test_native_kernels.py checks it), instead of building it again."""
    return tmp_path_factory.mktemp("build-cache")
