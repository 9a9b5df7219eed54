"""The one Flower App cuvil-edge runs, and the check that a run's app bundle (FAB) is that app.

`cuvil-edge run` submits ``cuvil_edge/cli/flwr_app`` (a pyproject and a module naming the
installed ServerApp and ClientApp; no other code). Flower hands every process of a run the FAB the
run names, and any holder of a Control API connection can name any FAB. So a process that is about
to act for a run first compares the run's FAB with the FAB Flower builds from the app installed on
its own machine, entry by entry, before anything of it is imported (agent/app_gate.py does this on
a device). Both sides must run the same cuvil-edge release and the same Flower minor version: a
FAB from another release is refused with a message saying so.
"""

from __future__ import annotations

import io
import zipfile
from functools import lru_cache
from pathlib import Path

from cuvil_edge.errors import CuvilError

#: The Flower App directory `cuvil-edge run` and `cuvil-edge demo` submit.
APP_DIR = Path(__file__).resolve().parents[1] / "cli" / "flwr_app"
#: Flower refuses FABs over 10 MB; ours is a few KB. Nothing larger is even opened.
MAX_FAB_BYTES = 10 * 1024 * 1024
MAX_ENTRIES = 64


class ForeignAppError(CuvilError):
    """A run's app bundle is not the cuvil-edge app installed here; nothing of it was imported."""


@lru_cache(maxsize=1)
def installed_app_entries() -> dict[str, bytes]:
    """Each entry of the FAB Flower builds from the installed app (name -> bytes)."""
    from flwr.cli.build import build_fab_from_disk

    return _entries(build_fab_from_disk(APP_DIR))


def _entries(fab: bytes) -> dict[str, bytes]:
    """The entries of a FAB, read within fixed limits.

    Raises:
        ForeignAppError: not a zip, too large, too many or oversized entries, or a name twice.
    """
    if len(fab) > MAX_FAB_BYTES:
        raise ForeignAppError(f"the run's app bundle is {len(fab):,} bytes; cuvil-edge's is a few KB")
    try:
        with zipfile.ZipFile(io.BytesIO(fab)) as archive:
            infos = archive.infolist()
            if len(infos) > MAX_ENTRIES or sum(i.file_size for i in infos) > MAX_FAB_BYTES:
                raise ForeignAppError(
                    f"the run's app bundle has {len(infos)} entries "
                    f"({sum(i.file_size for i in infos):,} bytes unpacked); not cuvil-edge's"
                )
            entries: dict[str, bytes] = {}
            for info in infos:
                if info.filename in entries:
                    raise ForeignAppError(f"the run's app bundle holds {info.filename!r} twice")
                entries[info.filename] = archive.read(info)
            return entries
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise ForeignAppError(f"the run's app bundle is not a readable FAB ({e})") from e


def check_run_app(fab: bytes) -> None:
    """Refuse ``fab`` unless every entry equals the installed app's (same names, same bytes).

    Raises:
        ForeignAppError: which entries differ, are missing or are extra (names only, truncated).
    """
    expected, got = installed_app_entries(), _entries(fab)
    if got == expected:
        return
    extra = sorted(set(got) - set(expected))
    missing = sorted(set(expected) - set(got))
    changed = sorted(n for n in set(got) & set(expected) if got[n] != expected[n])
    parts = [
        f"{label} {', '.join(repr(n[:80]) for n in names[:5])}"
        for label, names in (("extra", extra), ("missing", missing), ("different", changed))
        if names
    ]
    raise ForeignAppError(
        "the run's app is not the cuvil-edge app installed here (" + "; ".join(parts) + "): "
        "only `cuvil-edge run` of the same cuvil-edge release is executed; upgrade both sides "
        "to one release if this is your own run"
    )


def installed_app_hash() -> str:
    """sha256 of the FAB Flower builds from the installed app: the ``fab_hash`` a SuperLink gives a
    run of it when `cuvil-edge run` submitted it from this machine (the SuperLink hashes the bytes)."""
    import hashlib

    from flwr.cli.build import build_fab_from_disk

    return hashlib.sha256(build_fab_from_disk(APP_DIR)).hexdigest()


def acquire_tasks(
    address: str,
    secret_file: Path,
    task_type: str,
    handle,
    *,
    root_certificates: bytes | None,
    parent_pid: int | None = None,
    poll_s: float = 1.0,
    component: str = "SuperExec",
) -> None:
    """Poll the Runtime API at ``address`` for tasks of ``task_type`` (AcquireTask, signed with the
    executor secret in ``secret_file``) and call ``handle(task, token)`` for each; return when
    ``parent_pid`` is gone. This is the loop of Flower's ``flower-superexec``, which cuvil-edge's
    gates run instead of it so that they decide what is launched. ``root_certificates`` None means
    the plain-HTTP loopback Runtime API of a SuperNode.
    """
    import logging
    import os
    import time

    from flwr.proto.runtime_pb2 import AcquireTaskRequest  # pylint: disable=no-name-in-module
    from flwr.supercore.interceptors import RuntimeVersionHttpInterceptor, SuperExecAuthHttpInterceptor
    from flwr.supercore.retry import make_simple_http_retry_invoker
    from flwr.supercore.runtime import RuntimeHttpClient

    log = logging.getLogger(__name__)
    auth = SuperExecAuthHttpInterceptor(
        master_secret=Path(secret_file).read_bytes(), protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})
    )
    client = RuntimeHttpClient.from_server_address(
        server_address=address,
        insecure=root_certificates is None,
        root_certificates=root_certificates,
        interceptors=[RuntimeVersionHttpInterceptor(component_name=component), auth],
        retry_invoker=make_simple_http_retry_invoker(),
    )

    def alive() -> bool:
        if parent_pid is None:
            return True
        try:
            os.kill(parent_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True

    try:
        while alive():
            try:
                res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[task_type], agentapp_fab_hashes=[]))
            except Exception as e:  # noqa: BLE001 - the API restarts or is gone: the parent check decides
                log.debug("AcquireTask failed: %s", e)
                time.sleep(poll_s)
                continue
            if res.HasField("task") and res.token:
                handle(res.task, res.token)
            time.sleep(poll_s)
    finally:
        client.close()
