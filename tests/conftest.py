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

#: Seconds the longest tests took (node id, or module for a module one worker runs whole), longest
#: first, as they took in a whole-suite run (3 workers, 2 cores, nothing else running). They
#: are handed out first, one to each worker, then one short test each (a worker holds two queued
#: tests, so a worker busy with a long test takes no second long one), then the rest of these, then
#: everything else in collected order.
LONGEST = {
    "tests/e2e/test_deployment_guide.py::test_the_deployment_guide_reaches_rounds_resumes_rejoins_rotates_and_replaces": 231,
    "tests/e2e/test_deployment.py::test_a_killed_clientapp_fails_only_its_site_and_a_killed_supernode_rejoins_with_its_state": 179,
    "tests/e2e/test_deployment.py::test_enrolled_devices_run_a_rogue_is_refused_and_a_killed_coordinator_resumes": 98,
    "tests/e2e/test_demo_federation.py::test_demo_federation_learns_accounts_privacy_and_resumes": 72,
    "tests/e2e/test_breast_cancer_example.py::test_the_example_federation_learns_from_the_hospitals_own_files": 70,
    "tests/e2e/test_deployment_attacks.py": 60,
    "tests/e2e/test_deployment.py::test_run_checks_its_sites_first_and_interrupting_it_or_the_coordinator_stops_everything": 59,
    "tests/e2e/test_demo_federation.py::test_central_dp_stops_at_its_cap_and_a_resumed_run_counts_epsilon_from_where_it_stopped": 57,
    "tests/ir_serialize/test_pkg_fuzz_structured.py::test_structured_fuzzer_10k_cases_only_typed_errors": 53,
    "tests/e2e/test_install_profiles.py::test_the_device_install_is_lean_and_verifies_builds_evaluates_and_infers": 42,
    "tests/e2e/test_demo_federation.py::test_fedadam_from_the_yaml_learns_with_sites_planned_at_fp16_and_int8": 37,
    "tests/test_api.py::test_readme_python_api_example_as_written_simulates_one_round": 24,
    "tests/e2e/test_demo_federation.py::test_fedprox_from_the_yaml_learns_and_a_site_out_of_budget_drops_out_while_the_run_goes_on": 24,
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


def _group_suffix(items: list[pytest.Item]) -> None:
    """Append each ``xdist_group`` name to its tests' node ids, as xdist's ``--dist loadgroup``
    does: its scheduler keeps tests with the same ``@name`` on one worker. xdist 3.8 sets the
    private ``_nodeid``, which pytest 9 no longer reads, so without this every test of a group went
    to whichever worker was free and a module fixture (a federation) started once per worker."""
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if not names or "@" in item.nodeid.rsplit("]", 1)[-1]:
            continue  # no group, or xdist's own suffix took effect
        nodeid = f"{item.nodeid}@{'_'.join(names)}"
        if hasattr(item, "_id"):  # pytest >= 9 keeps the id as a NodeId
            from _pytest.nodeid import coerce_node_id

            item._id = coerce_node_id(nodeid)
        else:
            item._nodeid = nodeid


@pytest.hookimpl(wrapper=True, tryfirst=True)  # orders before xdist appends group names to the node ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    _order(items)
    result = yield
    if getattr(config.option, "loadgroup", False):  # a worker of `--dist loadgroup`
        _group_suffix(items)
    return result


def _order(items: list[pytest.Item]) -> None:
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


#: Folders whose tests run kernels. A test there that asked for the native C library runs its body a
#: second time with the library withheld (what ``CUVIL_EDGE_NATIVE=0``, a site without a compiler or a
#: failed compile leaves), so that the numpy code of every kernel it reached is held to the same
#: assertions; a test that never asked ran the same code either way and runs once.
NUMPY_RERUN = ("tests/ir/", "tests/conformance/", "tests/architectures/")
#: ...except the tests of the C kernels themselves, which compare them with numpy on their own
NATIVE_ONLY = ("tests/ir/test_int8_kernels.py",)


class _Asked(dict):
    """The native module's state, noting whether anything asked for the library."""

    asked = False

    def __getitem__(self, key: str) -> object:
        self.asked = True
        return super().__getitem__(key)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    if not item.nodeid.startswith(NUMPY_RERUN) or item.nodeid.startswith(NATIVE_ONLY):
        return (yield)
    from cuvil_edge.ir.ops import _native

    state = _native._state
    probe = _native._state = _Asked(state)
    try:
        result = yield
    finally:
        state.update(probe)  # a library the test loaded stays loaded for the tests after it
        _native._state = state
    if probe.asked and state.get("lib") is not None:
        funcargs = getattr(item, "funcargs", {})
        first_tmp = funcargs.get("tmp_path")
        if first_tmp is not None:  # what the first run wrote (a site's accepted package) is not in its way
            funcargs["tmp_path"] = Path(tempfile.mkdtemp(prefix="numpy-rerun-", dir=first_tmp.parent))
        _native._state = {"lib": None}
        try:
            item.runtest()
        except BaseException as e:
            e.add_note("(in the second run, with the native library withheld: the numpy kernels)")
            raise
        finally:
            _native._state = state
            if first_tmp is not None:
                funcargs["tmp_path"] = first_tmp
    return result


@pytest.fixture(scope="module")
def build_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for a test module, as a site keeps one. A test's first build of a model is
    cold (each test builds its own model or target); a second build of the same structure is a
    hit, as it would be at a site: the numpy rerun above then runs the module the first run built,
    with the native library withheld (the build does not depend on the library:
    tests/device_targets/test_native_kernels.py checks it), instead of building it again."""
    return tmp_path_factory.mktemp("build-cache")


@pytest.fixture(autouse=True)
def _own_flwr_home(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory,
                   request: pytest.FixtureRequest) -> None:
    """A ``FLWR_HOME`` for this test alone (not created: Flower makes it when it writes there)."""
    name = hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:16]
    monkeypatch.setenv("FLWR_HOME", str(tmp_path_factory.getbasetemp() / "flwr-homes" / name))
