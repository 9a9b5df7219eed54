"""What every test shares, so that the suite runs on parallel workers (pytest-xdist, `run.sh test`).

- Each test has its own ``FLWR_HOME`` (Flower's CLI writes its config and credentials there), and
  Flower started from any test is quiet and offline.
- Ports handed to servers come from :func:`free_port`: a range below the kernel's ephemeral range
  (so no outgoing connection, which takes its local port from that range, can grab one between
  choosing it and the server binding it), each port reserved by an exclusive lock file that this
  process holds until it exits (so neither another worker nor another pytest run on this machine
  picks the same port). The project's own ``free_port`` (a bind to port 0, released at once) is
  swapped for it in this process; subprocesses keep the project's.
- The longest end-to-end tests are collected first, so that with ``--dist loadgroup`` they start
  at once, on different workers, and the short tests fill in around them.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import sys
import tempfile
from pathlib import Path

import pytest

from cuvil_edge.config.flower_env import FLOWER_ENV

for _key, _value in FLOWER_ENV.items():
    os.environ.setdefault(_key, _value)
# Rich renders to captured output as to an 80-column terminal, wrapping long lines, and tests
# compare that text: a path under a worker's tmp dir (popen-gwN/) is longer than a serial run's
# and got broken mid-word. Every process (workers start with COLUMNS=80 LINES=24, which a console
# made at import would keep for good) renders 200 columns wide instead, serial or parallel alike.
os.environ["COLUMNS"] = "200"
os.environ.pop("LINES", None)

#: Seconds the longest tests took in a serial run on this loaded 2-core machine (node id, or module
#: for a module one worker runs whole), longest first. They are handed out first, one to each
#: worker, then one short test each (a worker holds two queued tests, so a worker busy with a long
#: test takes no second long one), then the rest of these, then everything else in collected order.
LONGEST = {
    "tests/e2e/test_deployment_guide.py::test_the_deployment_guide_reaches_rounds_resumes_rejoins_rotates_and_replaces": 257,
    "tests/e2e/test_deployment_attacks.py": 230,
    "tests/e2e/test_deployment.py::test_run_checks_its_sites_first_and_interrupting_it_or_the_coordinator_stops_everything": 204,
    "tests/ir_serialize/test_pkg_fuzz_structured.py::test_structured_fuzzer_10k_cases_only_typed_errors": 194,
    "tests/e2e/test_deployment.py::test_a_killed_clientapp_fails_only_its_site_and_a_killed_supernode_rejoins_with_its_state": 193,
    "tests/e2e/test_install_profiles.py::test_the_device_install_is_lean_and_verifies_builds_evaluates_and_infers": 143,
    "tests/e2e/test_deployment.py::test_enrolled_devices_run_a_rogue_is_refused_and_a_killed_coordinator_resumes": 130,
    "tests/e2e/test_demo_federation.py::test_central_dp_stops_at_its_cap_and_a_resumed_run_counts_epsilon_from_where_it_stopped": 71,
    "tests/e2e/test_demo_federation.py::test_demo_federation_learns_accounts_privacy_and_resumes": 53,
    "tests/e2e/test_breast_cancer_example.py::test_the_example_federation_learns_from_the_hospitals_own_files": 51,
    "tests/test_api.py::test_readme_python_api_example_as_written_simulates_one_round": 44,
    "tests/ir_serialize/test_pkg_fuzz.py::test_mutation_fuzzer_10k_cases_only_typed_errors": 39,
    "tests/device_targets/test_native_kernels.py::test_concurrent_first_uses_compile_without_corrupting_the_cache": 29,
}

_LOCKS = Path(tempfile.gettempdir()) / "cuvil-edge-test-ports"
_held: list[int] = []  # lock file descriptors, open (so locked) until this process exits
_cursor: list[int] = []


def _pool() -> range:
    """Ports below the ephemeral range (``ip_local_port_range``), or above it where it starts low."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    if low - 1024 >= 4096:
        return range(max(1024, low - 12000), low)
    return range(high + 1, min(65536, high + 12000))


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on and that no other test process will hand out."""
    pool = _pool()
    if not _cursor:  # start each process somewhere else in the pool, then walk on without reuse
        seed = f"{os.environ.get('PYTEST_XDIST_WORKER', '')}:{os.getpid()}".encode()
        _cursor.append(int.from_bytes(hashlib.sha256(seed).digest()[:4], "big") % len(pool))
    _LOCKS.mkdir(exist_ok=True)
    for _ in range(len(pool)):
        port = pool[_cursor[0] % len(pool)]
        _cursor[0] += 1
        fd = os.open(_LOCKS / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:  # in use by something outside this scheme; keep it locked and move on
            _held.append(fd)
            continue
        _held.append(fd)
        return port
    raise RuntimeError(f"no free port left in {pool}")


def pytest_configure(config: pytest.Config) -> None:
    # pytest keeps this module as a plugin; under the bare name "conftest" it would shadow
    # tests/ir_serialize/conftest.py, whose helpers other folders import by that name
    if getattr(sys.modules.get("conftest"), "__file__", None) == __file__:
        del sys.modules["conftest"]
    # before test modules import it by name (`from ... import free_port`)
    from cuvil_edge.cli import local_federation
    from cuvil_edge.coordinator import launcher, superlink

    for module in (superlink, local_federation, launcher):
        module.free_port = free_port


def _seconds(item: pytest.Item) -> float:
    return LONGEST.get(item.nodeid, LONGEST.get(item.nodeid.split("::")[0], 0))


@pytest.hookimpl(tryfirst=True)  # before xdist appends group names to the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    units: dict[str, list[pytest.Item]] = {}  # a module one worker runs whole stays together
    rest = []
    for item in items:
        if not _seconds(item):
            rest.append(item)
        else:
            units.setdefault(item.nodeid if item.nodeid in LONGEST else item.nodeid.split("::")[0], []).append(item)
    ordered = sorted(units.values(), key=lambda unit: -_seconds(unit[0]))  # stable
    first = [item for unit in ordered[:workers] for item in unit]
    later = [item for unit in ordered[workers:] for item in unit]
    items[:] = first + rest[:workers] + later + rest[workers:]


@pytest.fixture(autouse=True)
def _own_flwr_home(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory,
                   request: pytest.FixtureRequest) -> None:
    """A ``FLWR_HOME`` for this test alone (not created: Flower makes it when it writes there)."""
    name = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    monkeypatch.setenv("FLWR_HOME", str(tmp_path_factory.getbasetemp() / "flwr-homes" / name))
