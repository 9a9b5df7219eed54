"""The example systemd units (configs/systemd/) run the coordinator and the agent sandboxed:
read-only system and no home directories, one writable home, no devices, no capabilities,
IP and Unix sockets only, the system-service syscall set; checked with `systemd-analyze` where it exists."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from cuvil_edge.agent.daemon import REFUSED_EXIT

UNITS = Path(__file__).resolve().parents[2] / "configs" / "systemd"
NAMES = ["cuvil-edge-agent.service", "cuvil-edge-coordinator.service"]

#: Directive -> the value both units must give it (the [Service] section).
HARDENED = {
    "User": "cuvil",
    "UMask": "0077",
    "NoNewPrivileges": "true",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "CapabilityBoundingSet": "",
    "AmbientCapabilities": "",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "SystemCallArchitectures": "native",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "ProtectClock": "yes",
    "ProtectHostname": "yes",
    "RestrictNamespaces": "yes",
    "RestrictRealtime": "yes",
    "RestrictSUIDSGID": "yes",
    "LockPersonality": "yes",
    "RemoveIPC": "yes",
    "PrivateMounts": "yes",
    "ProtectProc": "invisible",
}


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> directive -> every value it is given, in order (a unit may repeat a directive)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"{path.name}:{number}: continuation lines are not used in these units"
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, sep, value = line.partition("=")
        assert current is not None and sep, f"{path.name}:{number}: not a directive: {line!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _home(service: dict[str, list[str]]) -> str:
    argv = shlex.split(service["ExecStart"][0])
    return argv[argv.index("--home") + 1]


@pytest.mark.parametrize("name", NAMES)
def test_systemd_units_are_hardened(name):
    service = parse_unit(UNITS / name)["Service"]
    wrong = {k: service.get(k) for k, v in HARDENED.items() if service.get(k) != [v]}
    assert not wrong, f"{name}: directives missing or not hardened: {wrong}"
    assert service["SystemCallFilter"] == ["@system-service", "~@privileged"]
    home = _home(service)
    assert service["ReadWritePaths"] == [home]  # the home only: everything else stays read-only
    for variable in service.get("Environment", []):  # caches point into the writable home
        key, _, value = variable.partition("=")
        assert value.startswith(home + "/"), f"{name}: {key} is {value}, outside the writable home {home}"
    for path in [service["WorkingDirectory"][0], home, shlex.split(service["ExecStart"][0])[0]]:
        assert not re.match(r"^/(home|root|run/user)(/|$)", path), f"{name}: {path} is hidden by ProtectHome=yes"


def test_only_the_coordinator_denies_writable_executable_memory():
    """The agent runs PyTorch (JIT-generated oneDNN kernels) and its own compiled kernels; the
    coordinator runs no generated code, so it gets W^X."""
    agent = parse_unit(UNITS / "cuvil-edge-agent.service")["Service"]
    coordinator = parse_unit(UNITS / "cuvil-edge-coordinator.service")["Service"]
    assert coordinator["MemoryDenyWriteExecute"] == ["yes"]
    assert "MemoryDenyWriteExecute" not in agent
    assert "CUVIL_EDGE_NATIVE_CACHE" in " ".join(agent["Environment"])  # ~/.cache is not writable there


def test_the_agent_unit_does_not_restart_a_refused_node():
    """`agent run` exits with REFUSED_EXIT; systemd sees it modulo 256 and cannot parse a value above 255."""
    service = parse_unit(UNITS / "cuvil-edge-agent.service")["Service"]
    assert service["RestartPreventExitStatus"] == [str(REFUSED_EXIT % 256)]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed here")
@pytest.mark.parametrize("name", NAMES)
def test_systemd_analyze_verifies_the_units(tmp_path, name):
    """`systemd-analyze verify` accepts every directive; the executable, which exists only once installed,
    is replaced by one that exists here (verify refuses a missing one). `security --offline` rates them."""
    text = (UNITS / name).read_text(encoding="utf-8")
    unit = tmp_path / name
    unit.write_text(text.replace("/srv/cuvil-edge/.venv/bin/cuvil-edge", shutil.which("true")), encoding="utf-8")
    verify = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in (verify.stdout + verify.stderr).splitlines() if name in line]
    assert verify.returncode == 0 and not complaints, verify.stdout + verify.stderr
    version = re.search(r"systemd (\d+)", subprocess.run(["systemd-analyze", "--version"], capture_output=True,
                                                          text=True, timeout=60).stdout)
    if version is None or int(version.group(1)) < 250:  # `security --offline` came with systemd 250
        return
    security = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True,
                              text=True, timeout=60)
    rated = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?)", security.stdout)
    assert security.returncode == 0 and rated is not None, security.stdout + security.stderr
    assert float(rated.group(1)) <= 2.5, security.stdout  # the unhardened units rated 9.0 ("UNSAFE")
