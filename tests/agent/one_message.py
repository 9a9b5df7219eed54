"""Handle one message in this fresh process, as Flower's `flwr-clientapp` does on a deployed device.

    python tests/agent/one_message.py KIND PACKAGE SITE_FILE DEVICE_HOME ROUND

KIND is ``train`` or ``evaluate``; PACKAGE a file holding the package bytes. Prints one JSON line:
seconds spent importing Flower and the ClientApp, handling the message, which heavy modules the
process imported, and the reply's error or metrics. :func:`enrolled_device` sets up a device and
sends it rounds this way (a subprocess each time, so nothing is cached in memory, or a process
forked from the agent's warm task starter); used by
tests/agent/test_clientapp_process.py and bench/bench_clientapp.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("torch", "onnx", "onnxruntime", "opacus", "sklearn", "scipy", "matplotlib", "ray")


def main(kind: str, package_file: str, site_file: str, home: str, server_round: int) -> dict:
    t0 = time.perf_counter()
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, Metadata, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    t_flwr = time.perf_counter()
    from cuvil_edge.agent import client_app
    from cuvil_edge.config import load_site

    t_app = time.perf_counter()
    for name in ("_run_id", "_node_id", "_task_id"):  # Message() outside a run needs a task identity
        if hasattr(TaskIdentity, name):
            setattr(TaskIdentity, name, 1)
    site = load_site(site_file)
    package = open(package_file, "rb").read()
    content = {"config": ConfigRecord({"site": site.site, "package": package, "server-round": server_round})}
    meta = Metadata(run_id=1, message_id=f"m{time.monotonic_ns()}", src_node_id=0, dst_node_id=1,
                    reply_to_message_id="", group_id="", created_at=time.time(), ttl=600,
                    message_type=MessageType.TRAIN if kind == "train" else MessageType.EVALUATE)
    if kind == "train":
        content["arrays"] = ArrayRecord({})  # empty: the reply carries every trainable weight
    context = Context(run_id=1, node_id=1, node_config={"home": home, "site-config": site_file, "partition-id": 0,
                                                          "num-partitions": 3}, state=RecordDict(), run_config={})
    handler = client_app.train if kind == "train" else client_app.evaluate
    t_handle = time.perf_counter()
    reply = handler(Message(content=RecordDict(content), metadata=meta), context)
    t_end = time.perf_counter()
    return {"kind": kind, "import_flwr_s": t_flwr - t0, "import_clientapp_s": t_app - t_flwr,
            "handle_s": t_end - t_handle, "heavy_modules": sorted(m for m in HEAVY if m in sys.modules),
            "error": reply.error.reason if reply.has_error() else None,
            "metrics": {} if reply.has_error() else dict(reply.content["metrics"])}


def _reply_into(queue, kind: str, package_file: str, site_file: str, home: str, server_round: int) -> None:
    queue.put(main(kind, package_file, site_file, home, server_round))


def enrolled_device(root: Path):
    """An enrolled device of the demo federation's first site (its packages sealed for it);
    returns (send, device home), where ``send(kind)`` issues the next round's package (same model,
    new weights) and has a fresh process handle it, returning that process's JSON line plus its
    wall time as ``process_s``."""
    import numpy as np

    from cuvil_edge.cli.local_federation import set_up
    from cuvil_edge.config import load_federation
    from cuvil_edge.config.home import versions_file
    from cuvil_edge.coordinator.keys import load_signing_keys
    from cuvil_edge.coordinator.model import load_federation_model
    from cuvil_edge.coordinator.packaging import PackageFactory, VersionCounter
    from cuvil_edge.coordinator.registry import SiteRegistry

    fed_path = Path(__file__).resolve().parents[2] / "configs" / "federation.yaml"
    home, devices = set_up(root, fed_path)
    federation = load_federation(fed_path)
    graph = load_federation_model(federation.model, federation.seed)
    factory = PackageFactory(graph, federation.load_sites(), load_signing_keys(home / "keys" / "coordinator.key"),
                             VersionCounter(versions_file(home)), 3600, seal_keys=SiteRegistry(home).seal_keys())
    site_file, device_home = devices[0]
    site = federation.load_sites()[0].site
    rng = np.random.default_rng(0)
    rounds = iter(range(1, 1_000_000))

    def send(kind: str, starter=None) -> dict:
        """``starter`` (an app_gate.TaskStarter): the process is forked from its warm process, as
        the agent's executor starts a task, instead of being a new interpreter."""
        server_round = next(rounds)
        weights = {k: (v + 0.01 * rng.standard_normal(v.shape)).astype(v.dtype)
                   for k, v in graph.initializers.items() if v.dtype == np.float32}
        package = root / f"round-{server_round}.cpkg"
        package.write_bytes(factory.issue(site, weights).data)
        start = time.perf_counter()
        if starter is not None:
            queue = starter.queue()
            process = starter.fork(_reply_into, queue, kind, str(package), str(site_file), str(device_home),
                                   server_round)
            reply = queue.get(timeout=600)
            process.join(timeout=60)
            return {**reply, "process_s": time.perf_counter() - start}
        proc = subprocess.run([sys.executable, __file__, kind, str(package), str(site_file), str(device_home),
                               str(server_round)], capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"the ClientApp process failed: {proc.stderr[-3000:]}")
        return {**json.loads(proc.stdout.strip().splitlines()[-1]), "process_s": time.perf_counter() - start}

    return send, device_home


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))))
