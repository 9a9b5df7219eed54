"""The coordinator runs only its own installed ServerApp: the executor of the SuperLink's ServerApp tasks.

The SuperLink's Control API listens on loopback but authenticates nobody, so any process on the
coordinator host can submit a run; Flower's own executor would then run that run's ServerApp as
the coordinator's service user, beside the keys. `coordinator serve` runs this executor instead
(it holds the Runtime API secret, so it is the only one that can take ServerApp tasks). For each
task it compares the run's ``fab_hash`` (the SuperLink's sha256 of the FAB bytes) with the hash of
the FAB Flower builds from the app installed here (config/flower_app.py): a run `cuvil-edge run`
submitted on this machine matches, and is handed to Flower's own ``flwr-serverapp`` as Flower's
executor would; any other run is refused without a byte of it installed or imported, logged, and
ended as failed with the reason.

Run as ``python -m cuvil_edge.coordinator.serverapp_gate --runtime-api-address 127.0.0.1:PORT
--root-certificates CA --secret-file FILE --parent-pid PID`` (started and stopped by `serve`).
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)


class ServerAppGate:
    """Launches or refuses each ServerApp task the SuperLink hands out."""

    def __init__(self, address: str, ca_file: Path, expected_hash: str) -> None:
        self.address, self.ca_file, self.expected_hash = address, Path(ca_file), expected_hash
        self.running: list[subprocess.Popen] = []

    def __call__(self, task, token: str) -> None:
        self.running = [p for p in self.running if p.poll() is None]  # reap finished runs
        if task.fab_hash == self.expected_hash:
            self.running.append(subprocess.Popen(self._serverapp_command(token)))
        else:
            self.refuse(task, token)

    def _serverapp_command(self, token: str) -> list[str]:
        from cuvil_edge.config.flower_env import flower_tool

        return [
            flower_tool("flwr-serverapp"),
            "--runtime-api-address",
            self.address,
            "--token",
            token,
            "--root-certificates",
            str(self.ca_file),
            "--parent-pid",
            str(os.getpid()),
        ]

    def refuse(self, task, token: str) -> None:
        """End the task as failed, with the reason, without installing or importing its app."""
        from flwr.common.constant import SubStatus
        from flwr.proto.runtime_pb2 import PullTaskInputRequest, PushTaskOutputRequest
        from flwr.supercore.interceptors import RuntimeTokenHttpInterceptor, RuntimeVersionHttpInterceptor
        from flwr.supercore.runtime import RuntimeHttpClient

        reason = (
            f"refused by the coordinator: run {task.run_id}'s app (FAB {task.fab_hash[:16]}...) is not the "
            "cuvil-edge app installed here; only `cuvil-edge run` on this machine is executed"
        )
        log.error("%s", reason)
        client = RuntimeHttpClient.from_server_address(
            server_address=self.address,
            insecure=False,
            root_certificates=self.ca_file.read_bytes(),
            interceptors=[
                RuntimeVersionHttpInterceptor(component_name="flwr-serverapp"),
                RuntimeTokenHttpInterceptor(token),
            ],
        )
        try:
            client.PullTaskInput(PullTaskInputRequest())  # the task must be started before it can end
            client.PushTaskOutput(PushTaskOutputRequest(sub_status=SubStatus.FAILED, details=reason))
        except Exception:  # logged; the SuperLink expires the task by itself
            log.exception("ending the refused run %s failed", task.run_id)
        finally:
            client.close()


def main(argv: list[str] | None = None) -> int:
    from flwr.supercore.constant import TaskType

    from cuvil_edge.config.flower_app import acquire_tasks, installed_app_hash

    parser = argparse.ArgumentParser(description="cuvil-edge's ServerApp executor (started by `coordinator serve`)")
    parser.add_argument("--runtime-api-address", required=True, help="the SuperLink's loopback address")
    parser.add_argument("--root-certificates", type=Path, required=True, help="the federation's CA")
    parser.add_argument("--secret-file", type=Path, required=True, help="the Runtime API secret")
    parser.add_argument("--parent-pid", type=int, help="stop when this process is gone")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s cuvil-edge serverapp-gate %(levelname)s %(message)s")
    gate = ServerAppGate(args.runtime_api_address, args.root_certificates, installed_app_hash())
    acquire_tasks(
        args.runtime_api_address,
        args.secret_file,
        TaskType.SERVER_APP,
        gate,
        root_certificates=args.root_certificates.read_bytes(),
        parent_pid=args.parent_pid,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
