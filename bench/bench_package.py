"""Package benchmark: verify + map of a ~100 MB package, sealing throughput, and
the coordinator's time to issue one phase of 20 fp32 site packages of a 46 MB model.

    .venv/bin/python bench/bench_package.py            # writes bench/results/package.json

verify+map = open_package on a file (mmap, two Ed25519 checks, strict parsing, sha256 of
every region, container layout, graph rebuild); tensors are views of the map (no copy).
Target: <= 100 ms for 100 MB, i.e. bound by sha256.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuvil_edge.ir.graph import Node, TensorType, Value  # noqa: E402
from cuvil_edge.ir.infer import build_graph  # noqa: E402
from cuvil_edge.ir_serialize import (AntiRollbackState, generate_keypair, make_root, open_package, sign_root,  # noqa: E402
                                     write_package)
from cuvil_edge.ir_serialize.sealing import generate_seal_keypair, seal, unseal  # noqa: E402

MB = 10**6


def big_graph(total_bytes: int):
    """A chain of Gemm layers (float32) holding about ``total_bytes`` of weights."""
    width, layers = 1024, max(1, total_bytes // (1024 * 1024 * 4))
    rng = np.random.default_rng(0)
    nodes, inits, cur = [], {}, "x"
    for i in range(layers):
        inits[f"w{i:03d}"] = rng.standard_normal((width, width), dtype=np.float32)
        nodes.append(Node(f"fc{i}", "Gemm", (cur, f"w{i:03d}"), (f"h{i}",), {}))
        cur = f"h{i}"
    return build_graph("big", [Value("x", TensorType("float32", ("batch", width)))], [cur], nodes, inits, 13)


def best(fn, repeat=5):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times), float(np.median(times))


def issue_phase(sites: int = 20, size: int = 46 * MB) -> dict:
    """Seconds to issue one phase's packages (every site fp32, one set of weights) as the personaliser
    does, from :class:`FrozenWeights` (hashed, encoded and released once) and from a plain mapping
    (hashed again for every site)."""
    from cuvil_edge.config.site import SiteConfig
    from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
    from cuvil_edge.coordinator.packaging import FrozenWeights, PackageFactory, VersionCounter

    graph = big_graph(size)
    configs = [SiteConfig.model_validate({"site": f"s{i}", "target": "x86-64", "privacy": {
        "epsilon_budget": 8.0, "epsilon_per_round": 2.0}}) for i in range(sites)]
    out = {"sites": sites, "weights_MB": round(graph.parameter_bytes() / MB, 1)}
    with tempfile.TemporaryDirectory() as d:
        init_keys(Path(d) / "keys")
        factory = PackageFactory(graph, configs, load_signing_keys(Path(d) / "keys" / "coordinator.key"),
                                 VersionCounter(Path(d) / "v.json"), 600)
        for label, wrap in (("frozen_s", FrozenWeights), ("plain_mapping_s", dict)):
            shift = iter(range(1, 100))  # new weights every phase, as every round has

            def phase():
                weights = wrap({k: v + np.float32(next(shift)) for k, v in graph.initializers.items()})
                for c in configs:
                    factory.issue(c.site, weights)
            out[label] = round(best(phase, 3)[0], 3)
    return out


def main() -> None:
    keys = {r: generate_keypair()[0] for r in ("root", "release", "coordinator")}
    now = int(time.time())
    root_json = sign_root(make_root(1, now + 3600, {r: [k.public_key()] for r, k in keys.items()}), [keys["root"]])
    graph = big_graph(100 * MB)
    data = write_package(graph, "site-a", "cpu", 1, keys["coordinator"], release_key=keys["release"],
                         issued_at=now, expires=now + 3600)
    results = {"python": platform.python_version(), "machine": platform.machine(), "package_bytes": len(data)}
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "p.cpkg"
        path.write_bytes(data)
        state = AntiRollbackState(Path(d) / "state")
        state.initialise(root_json)
        kw = dict(site="site-a", target="cpu", now=now, max_package_bytes=1 << 31)
        open_package(path, state, **kw)  # warm the page cache; later calls are idempotent re-deliveries
        b, med = best(lambda: open_package(path, state, **kw))
        results["verify_and_map_s"] = {"best": round(b, 4), "median": round(med, 4), "target": 0.1}
        b, _ = best(lambda: hashlib.sha256(data).digest())
        results["sha256_whole_file_s"] = round(b, 4)
    plain = bytes(data[-100 * MB:])
    priv, pub = generate_seal_keypair()
    aad = hashlib.sha256(b"manifest").digest()
    sealed = seal(plain, pub, info=b"i", aad=aad)
    bs, _ = best(lambda: seal(plain, pub, info=b"i", aad=aad), 3)
    bu, _ = best(lambda: unseal(memoryview(sealed), priv, info=b"i", aad=aad, plain_length=len(plain)), 3)
    results["seal_MB_per_s"] = round(len(plain) / MB / bs, 1)
    results["unseal_MB_per_s"] = round(len(plain) / MB / bu, 1)
    results["issue_phase"] = issue_phase()
    out = ROOT / "bench" / "results" / "package.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
