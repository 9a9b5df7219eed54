"""The base install (pyproject's dependencies) holds no torch, onnx, Flower, scipy...: a device's
commands must neither import them nor need them. Checked here in fresh processes of the full
venv with those packages made unimportable; tests/e2e/test_install_profiles.py installs the
wheel into a bare venv and runs the same device flow there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from device_flow import OPTIONAL, check, device_files  # noqa: E402 - a script beside this test, also run in a fresh venv
FLOW = ROOT / "tests" / "device_flow.py"
ABSENT = f"import sys\nfor name in {OPTIONAL!r}:\n    sys.modules[name] = None\n"


def _signed_package(tmp_path: Path) -> tuple[bytes, Path]:
    from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
    from cuvil_edge.frontend import load_model
    from cuvil_edge.frontend.demo_model import digits_cnn_onnx
    from cuvil_edge.ir_serialize import write_package

    private, root = init_keys(tmp_path / "keys")
    keys, now = load_signing_keys(private), int(time.time())
    package = write_package(load_model(digits_cnn_onnx(3)), site="lean-1", target="x86-64", version=1,
                            signing_key=keys.coordinator, release_key=keys.release, issued_at=now, expires=now + 600)
    return package, root


def _python(code: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd)


def test_the_device_flow_runs_with_every_optional_dependency_absent(tmp_path):
    package, root = _signed_package(tmp_path)
    files = device_files(tmp_path / "device", package, root.read_bytes())
    proc = subprocess.run([sys.executable, str(FLOW), "--absent", *(str(files[k]) for k in
                           ("package", "site", "home", "root", "x", "out"))],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check(json.loads(proc.stdout.strip().splitlines()[-1]), files["out"])


@pytest.mark.parametrize("modules, allowed", [
    # the base install: the CLI with every command mounted, verify/build, evaluation, inference, the ledger
    (["cuvil_edge.cli.main", "cuvil_edge.cli.agent_cmd", "cuvil_edge.agent.runtime", "cuvil_edge.agent.inference",
      "cuvil_edge.device_targets.build", "cuvil_edge.datasets.site_files", "cuvil_edge.privacy",
      "cuvil_edge.agent.daemon", "cuvil_edge.agent.enroll", "cuvil_edge.api"], ()),
    # cuvil-edge[agent]: the ClientApp and its gate on Flower alone (torch only when it trains)
    (["cuvil_edge.agent.client_app", "cuvil_edge.agent.app_gate"], ("flwr", "grpc", "httpx")),
])
def test_device_modules_import_no_optional_dependency(modules, allowed):
    code = textwrap.dedent(f"""
        import importlib, sys
        for m in {modules!r}:
            importlib.import_module(m)
        from cuvil_edge.cli.main import mounted_app
        mounted_app()
        print(sorted(m for m in {OPTIONAL!r} if m in sys.modules))
    """)
    out = _python(code)
    assert out.returncode == 0, out.stderr
    assert set(eval(out.stdout.strip())) <= set(allowed)


def test_a_command_that_needs_another_profile_names_its_extra(tmp_path):
    (tmp_path / "m.onnx").write_bytes(b"not read")
    code = ABSENT + textwrap.dedent(f"""
        from cuvil_edge.cli.main import main
        sys.exit(main(["compile", {str(tmp_path / 'm.onnx')!r}, "--report"]))
    """)
    out = _python(code, cwd=tmp_path)
    assert out.returncode == 2
    assert re.fullmatch(r"error: importing an ONNX model needs onnx \(onnx not installed\): "
                        r"pip install 'cuvil-edge\[coordinator\]'\n", out.stderr)


@pytest.mark.parametrize("call, extra", [
    ("from cuvil_edge.agent.training import train_round\n"
     "train_round(None, None, None, None, 1, 1)", "train"),
    ("from cuvil_edge.datasets import digits\ndigits.site_partition(0, 3)", "coordinator"),
])
def test_each_missing_dependency_is_a_typed_error_naming_the_extra(call, extra):
    code = ABSENT + "from cuvil_edge.errors import MissingDependencyError\ntry:\n" + textwrap.indent(call, "    ") + \
        "\nexcept MissingDependencyError as e:\n    print(e.extra, '|', e)\n"
    out = _python(code)
    assert out.returncode == 0, out.stderr
    got, message = out.stdout.strip().split(" | ")
    assert got == extra and f"pip install 'cuvil-edge[{extra}]'" in message


@pytest.mark.parametrize("tool, extra", [("flower-supernode", "agent"), ("flower-superlink", "coordinator"),
                                         ("flwr", "coordinator")])
def test_a_missing_flower_command_names_the_extra(monkeypatch, tool, extra):
    from cuvil_edge.config import flower_env
    from cuvil_edge.errors import ConfigError, MissingDependencyError

    monkeypatch.setattr(flower_env.shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(MissingDependencyError, match=re.escape(f"pip install 'cuvil-edge[{extra}]'")) as caught:
        flower_env.flower_tool(tool)
    assert isinstance(caught.value, ConfigError) and caught.value.extra == extra
