"""Handle one message in this fresh process, as Flower's `flwr-clientapp` does on a deployed device.

    python tests/agent/one_message.py KIND PACKAGE SITE_FILE DEVICE_HOME ROUND

KIND is ``train`` or ``evaluate``; PACKAGE a file holding the package bytes. Prints one JSON line:
seconds spent importing Flower and the ClientApp, handling the message, which heavy modules the
process imported, and the reply's error or metrics. Used by tests/agent/test_clientapp_process.py
and bench/bench_clientapp.py (a subprocess each time, so nothing is cached in memory).
"""

from __future__ import annotations

import json
import sys
import time

HEAVY = ("torch", "onnx", "onnxruntime", "opacus", "sklearn", "scipy", "matplotlib", "ray")


def main(kind: str, package_file: str, site_file: str, home: str, server_round: int) -> dict:
    t0 = time.perf_counter()
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, Metadata, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    t_flwr = time.perf_counter()
    from cuvil_edge.agent import client_app
    from cuvil_edge.config import load_site

    t_app = time.perf_counter()
    for name in ("_run_id", "_node_id", "_task_id"):  # Message() outside a run (notes/flower-1.42.md §5)
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


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))))
