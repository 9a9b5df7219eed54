"""Install like a library, lean on devices: the wheel builds, its base install (a device) goes into
a bare venv without torch, onnx, Flower, scipy..., fits in 100 MB and verifies, builds, evaluates
and runs `agent infer` there; `[agent]` then adds Flower and what Flower needs, nothing else, and
the ClientApp evaluates a round's package in that venv (bench/results/install.md: every profile)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from cuvil_edge.frontend.demo_model import digits_cnn_onnx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from device_flow import OPTIONAL, check, device_files  # noqa: E402 - a script that runs in the fresh venv too

pytestmark = pytest.mark.e2e

#: The base install's budget (MB of site-packages, the venv's own pip and setuptools not counted).
DEVICE_MB = 100
#: What a venv holds before anything is installed: not part of any profile.
VENV_TOOLING = ("pip", "setuptools", "pkg_resources", "_distutils_hack", "distutils-precedence.pth")
#: Flower brings these itself (gRPC, its HTTP client and server); no other optional one comes with [agent].
FLOWER_OWN = ("flwr", "grpc", "httpx", "uvicorn")


def build_wheel(out: Path) -> Path:
    """`pip wheel --no-deps` of a clean copy of the source (no build/ left over from elsewhere)."""
    src = out / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "cuvil_edge", src / "cuvil_edge", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q", "--no-deps",
                    "-w", str(out / "dist"), str(src)], check=True, capture_output=True, text=True, timeout=300)
    (wheel,) = (out / "dist").glob("cuvil_edge-*.whl")
    return wheel


def site_packages_mb(venv: Path) -> float:
    """MB under the venv's site-packages, its own tooling (:data:`VENV_TOOLING`) not counted."""
    (site,) = (venv / "lib").glob("python3*/site-packages")
    total = 0
    for entry in site.iterdir():
        if entry.name.split("-")[0] in VENV_TOOLING or entry.name in VENV_TOOLING:
            continue
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file() and not p.is_symlink()]
        total += sum(p.stat().st_size for p in files)
    return total / 1e6


def installed(venv: Path) -> set[str]:
    """The distributions installed in ``venv`` (normalized names)."""
    code = ("import importlib.metadata as m, json, re; print(json.dumps(sorted({re.sub(r'[-_.]+', '-', "
            "d.metadata['Name']).lower() for d in m.distributions()})))")
    return set(json.loads(run(venv, "python", "-c", code).stdout))


def run(venv: Path, tool: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """``tool`` from the venv's bin, with only that bin and the system's on the PATH."""
    env = {**os.environ, "PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(venv / "bin" / tool), *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)
    assert proc.returncode == 0, f"{tool} {' '.join(args)}: {proc.stderr[-3000:]}"
    return proc


def importable(venv: Path) -> list[str]:
    code = ("import importlib.util, json; print(json.dumps([m for m in %r if importlib.util.find_spec(m)]))"
            % (OPTIONAL,))
    return json.loads(run(venv, "python", "-c", code).stdout)


def test_the_device_install_is_lean_and_verifies_builds_evaluates_and_infers(tmp_path):
    wheel = build_wheel(tmp_path / "build")
    # every file of the package is in the wheel: the target specs, the native kernels' C, the Flower app
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "cuvil_edge").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    assert source - names == set()

    # the coordinator, in this (full) venv: a home, and a package signed for the device's site
    coordinator = tmp_path / "coordinator"
    coordinator.mkdir()
    cli = [sys.executable, "-m", "cuvil_edge"]
    subprocess.run([*cli, "coordinator", "init", "--home", "home"], cwd=coordinator, check=True, capture_output=True)
    (coordinator / "model.onnx").write_bytes(digits_cnn_onnx(3))
    files = device_files(tmp_path / "device", b"", (coordinator / "home" / "keys" / "root.json").read_bytes())
    shutil.copy(files["site"], coordinator / "site.yaml")
    subprocess.run([*cli, "compile", "model.onnx", "--site", "site.yaml", "--key", "home/keys/coordinator.key",
                    "-o", str(files["package"])], cwd=coordinator, check=True, capture_output=True)

    # the device: a bare venv with the base install
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    before = installed(venv)
    start = time.perf_counter()
    run(venv, "python", "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-compile", str(wheel))
    install_s = time.perf_counter() - start
    assert importable(venv) == []
    size = site_packages_mb(venv)
    assert size <= DEVICE_MB, f"the base install takes {size:.0f} MB"
    base = installed(venv)

    assert run(venv, "cuvil-edge", "--version").stdout.strip() == "cuvil-edge 0.1.0"
    flow = run(venv, "python", str(ROOT / "tests" / "device_flow.py"),
               *(str(files[k]) for k in ("package", "site", "home", "root", "x", "out")), cwd=files["site"].parent)
    check(json.loads(flow.stdout.strip().splitlines()[-1]), files["out"])
    again = files["out"].with_name("again.npy")
    run(venv, "cuvil-edge", "agent", "infer", str(files["package"]), "--site", str(files["site"]), "--input",
        str(files["x"]), "--epsilon", "0.5", "--output", str(again), "--home", str(files["home"]),
        "--request-id", "console-1", cwd=files["site"].parent)
    import numpy as np

    assert np.load(again).shape == (5, 10)

    # [agent]: Flower and its own dependencies only; the ClientApp evaluates a round's package
    run(venv, "python", "-m", "pip", "install", "--disable-pip-version-check", "-q", "--no-compile",
        f"{wheel}[agent]")
    assert set(importable(venv)) <= set(FLOWER_OWN)
    assert flower_closure(venv) >= installed(venv) - base
    run(venv, "cuvil-edge", "agent", "run", "--help")
    reply = run(venv, "python", str(ROOT / "tests" / "agent" / "one_message.py"), "evaluate", str(files["package"]),
                str(files["site"]), str(files["home"]), "1", cwd=files["site"].parent)
    reply = json.loads(reply.stdout.strip().splitlines()[-1])
    assert reply["error"] is None and reply["heavy_modules"] == [], reply
    assert reply["metrics"]["eps-spent"] == pytest.approx(0.05 + 0.5 + 0.5 + 0.05)
    print(f"base install {size:.1f} MB ({len(base - before)} distributions, {install_s:.0f} s); "
          f"with [agent] {site_packages_mb(venv):.1f} MB")


def flower_closure(venv: Path) -> set[str]:
    """flwr and every distribution its requirements reach (with the extras they name), as installed
    in ``venv``."""
    code = """
import importlib.metadata as md, json, re
from packaging.requirements import Requirement
seen, todo = set(), [("flwr", "")]
while todo:
    name, extra = todo.pop()
    if (name, extra) in seen:
        continue
    seen.add((name, extra))
    try:
        requires = md.requires(name) or []
    except md.PackageNotFoundError:
        continue
    for text in requires:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": extra}):
            todo.extend((req.name, e) for e in ("", *req.extras))
print(json.dumps(sorted({re.sub(r"[-_.]+", "-", n).lower() for n, _ in seen})))
"""
    return set(json.loads(run(venv, "python", "-c", code).stdout))
