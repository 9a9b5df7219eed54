"""Target specs: the shipped YAML files load, validate, and map to capability constants."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from cuvil_edge.device_targets import list_targets, load_target
from cuvil_edge.device_targets.spec import SPECS_DIR
from cuvil_edge.errors import ConfigError, TargetError, TargetSpecError, UnknownTargetError
from cuvil_edge.ir.ops._util import DEFAULT_CAPABILITIES

SHIPPED = ["ascend-310", "jetson-orin-nano", "rpi4", "x86-64"]


def test_shipped_targets_are_listed():
    assert set(SHIPPED) <= set(list_targets())


@pytest.mark.parametrize("name", SHIPPED)
def test_spec_loads_and_gives_every_capability(name):
    spec = load_target(name)
    caps = spec.capabilities()
    assert spec.name == name
    assert set(caps) == set(DEFAULT_CAPABILITIES)
    for key, value in caps.items():
        assert type(value) is type(DEFAULT_CAPABILITIES[key]), key
    assert spec.peak_gflops["float32"] > 0 and spec.memory_bandwidth_gbs > 0


@pytest.mark.parametrize("name, key, expected", [
    ("rpi4", "TARGET_LARGE_SCRATCH", False),
    ("rpi4", "TARGET_SIMD_BITS", 128),
    ("x86-64", "TARGET_SIMD_BITS", 512),
    ("x86-64", "TARGET_LARGE_SCRATCH", True),
    ("jetson-orin-nano", "TARGET_HAS_GPU", True),
    ("ascend-310", "TARGET_STATIC_SHAPES", True),
    ("ascend-310", "TARGET_ARCH", "npu"),
    ("jetson-orin-nano", "COMPUTE_FP16", False),
])
def test_capability_values(name, key, expected):
    assert load_target(name).capabilities()[key] == expected


def test_fp16_precision_sets_compute_fp16_only_where_supported():
    assert load_target("jetson-orin-nano").capabilities("fp16")["COMPUTE_FP16"] is True
    with pytest.raises(TargetError, match="rpi4.*fp16"):
        load_target("rpi4").capabilities("fp16")
    with pytest.raises(TargetError, match="bf16"):
        load_target("x86-64").capabilities("bf16")


@pytest.mark.parametrize("name", ["jetson-nano-xl", "../specs/rpi4", "", "RPI4"])
def test_unknown_target_lists_known_names(name):
    with pytest.raises(UnknownTargetError) as info:
        load_target(name)
    assert isinstance(info.value, ConfigError)
    for known in SHIPPED:
        assert known in str(info.value)


def _write_variant(tmp_path: Path, name: str = "rpi4", **changes) -> Path:
    data = yaml.safe_load((SPECS_DIR / "rpi4.yaml").read_text())
    data.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del data[key]
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return tmp_path


@pytest.mark.parametrize("case, changes", [
    ("unknown key", {"npu_cores": 2}),
    ("missing key", {"memory_mb": None}),
    ("string for int (strict)", {"simd_bits": "128"}),
    ("float for int (strict)", {"memory_mb": 2048.5}),
    ("bool as string", {"fp16": "no"}),
    ("unknown arch", {"arch": "riscv64"}),
    ("unknown dtype", {"dtypes": ["float32", "bfloat17"], "peak_gflops": {"float32": 1.0}}),
    ("fp16 flag without float16 dtype", {"fp16": True}),
    ("peak for unlisted dtype", {"peak_gflops": {"float32": 1.0, "float16": 2.0}}),
    ("non-positive bandwidth", {"memory_bandwidth_gbs": 0.0}),
    ("static batch on dynamic target", {"static_batch": 4}),
])
def test_invalid_spec_is_rejected(tmp_path, case, changes):
    folder = _write_variant(tmp_path, **changes)
    with pytest.raises(TargetSpecError):
        load_target("rpi4", specs_dir=folder)


def test_spec_name_must_match_file(tmp_path):
    folder = _write_variant(tmp_path, name="other")
    with pytest.raises(TargetSpecError, match="file name"):
        load_target("other", specs_dir=folder)


def test_spec_is_frozen_and_digest_tracks_content(tmp_path):
    spec = load_target("rpi4")
    with pytest.raises(Exception):
        spec.memory_mb = 4096
    shutil.copy(SPECS_DIR / "rpi4.yaml", tmp_path / "rpi4.yaml")
    assert load_target("rpi4", specs_dir=tmp_path).digest() == spec.digest()
    changed = load_target("rpi4", specs_dir=_write_variant(tmp_path, memory_mb=4096))
    assert changed.digest() != spec.digest()


def test_a_spec_is_read_once_and_again_when_its_file_changes(tmp_path):
    import os
    import shutil

    from cuvil_edge.device_targets.spec import SPECS_DIR, load_target

    shutil.copy(SPECS_DIR / "rpi4.yaml", tmp_path / "rpi4.yaml")
    first = load_target("rpi4", specs_dir=tmp_path)
    assert load_target("rpi4", specs_dir=tmp_path) is first  # no second parse
    path = tmp_path / "rpi4.yaml"
    path.write_text(path.read_text().replace("memory_mb:", "memory_mb: 1024 #", 1))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert load_target("rpi4", specs_dir=tmp_path).memory_mb == 1024
    path.write_text("name: [")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 2 * 10**9))
    with pytest.raises(TargetSpecError):
        load_target("rpi4", specs_dir=tmp_path)
