"""Mutation fuzzer for the package reader (PACKAGE_SPEC §12).

Mutates valid packages (plain, sealed, with a root chain) and a bare container with bit
flips, byte writes, truncations, splices (from itself and from another package),
inserted/deleted ranges and edits of every length field, then verifies them.
The only acceptable outcomes are success on an unmodified input or a ``PackageError``;
anything else, or a case over the per-case time cap, is a finding.

    .venv/bin/python tests/ir_serialize/fuzz_package.py 1000000 --seed 1   # the 1M run

Exit status 0 when there are no findings.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from conftest import (EXPIRES, ISSUED, NOW, SITE, TARGET, cap_address_space, make_keys, make_trust,  # noqa: E402
                      mlp_graph, open_state)

from cuvil_edge.errors import PackageError  # noqa: E402
from cuvil_edge.ir_serialize import encode_payload, sign_root, verify_and_accept, write_package  # noqa: E402
from cuvil_edge.ir_serialize.container import _decode_payload  # noqa: E402
from cuvil_edge.ir_serialize.sealing import generate_seal_keypair  # noqa: E402
from cuvil_edge.ir_serialize.trust import make_root  # noqa: E402

CASE_TIME_CAP_S = 2.0
_TEMP_DIRS: list[tempfile.TemporaryDirectory] = []


class CaseTimeout(Exception):
    pass


@dataclass
class Report:
    cases: int = 0
    accepted: int = 0
    unchanged: int = 0  # mutations that happened to give back the original bytes (must verify)
    rejected: dict[str, int] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    slowest_s: float = 0.0


def corpus(seed: int = 0):
    """(name, bytes, verify-callable) for each seed input."""
    keys = make_keys()
    _, pinned = make_trust(keys)
    seal_priv, seal_pub = generate_seal_keypair()
    graph = mlp_graph(seed)
    common = dict(issued_at=ISSUED, expires=EXPIRES, release_key=keys["release"], release_counter=3)
    v2 = make_root(2, EXPIRES + 10, {r: [k.public_key()] for r, k in keys.items()})
    chain = [json.loads(sign_root(v2, [keys["root"]]))]
    plain = write_package(graph, SITE, TARGET, 5, keys["coordinator"], **common)
    sealed = write_package(graph, SITE, TARGET, 5, keys["coordinator"], seal_to=seal_pub, **common)
    rooted = write_package(graph, SITE, TARGET, 5, keys["coordinator"], roots=chain, nonce="n", **common)
    other = write_package(mlp_graph(seed + 1), SITE, TARGET, 6, keys["coordinator"], **common)
    kw = dict(site=SITE, target=TARGET, now=NOW, max_package_bytes=1 << 20)
    # One durable state per kind (the three share a site and version): the real entry point, state included.
    states = {}
    for kind in ("plain", "sealed", "rooted"):
        _TEMP_DIRS.append(tempfile.TemporaryDirectory(prefix=f"fuzz-{kind}-"))  # removed at exit
        states[kind] = open_state(Path(_TEMP_DIRS[-1].name), pinned, None)
    return [
        ("plain", plain, lambda b: verify_and_accept(b, states["plain"], **kw)),
        ("sealed", sealed, lambda b: verify_and_accept(b, states["sealed"], seal_key=seal_priv, **kw)),
        ("rooted", rooted, lambda b: verify_and_accept(b, states["rooted"], expected_nonce="n", **kw)),
        ("container", encode_payload(graph), lambda b: _decode_payload(b)),
    ], other


def _length_fields(data: bytes) -> list[tuple[int, str]]:
    """(offset, struct format) of every binary length field we know of."""
    spots = [(12, "<I")]  # package envelope length
    if data[:8] == b"CUVLIRC\0":
        spots.append((16, "<Q"))
    if data[:8] == b"CUVLSPK\0" and len(data) >= 20:
        n = struct.unpack_from("<I", data, 12)[0]
        start = -(-(20 + n) // 64) * 64
        if data[start:start + 8] == b"CUVLIRC\0":
            spots.append((start + 16, "<Q"))
        if data[start:start + 8] == b"CUVLSEAL":
            spots += [(start + 12, "<I"), (start + 16, "<Q")]
    return spots


_EDGE = [0, 1, 63, 64, 65, 2**31 - 1, 2**32 - 1, 2**63 - 1, 2**64 - 1]


def mutate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        op = rng.randrange(8)
        if not b:
            break
        i = rng.randrange(len(b))
        if op == 0:
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[i] = rng.randrange(256)
        elif op == 2:
            del b[rng.randrange(len(b) + 1):]
        elif op == 3:  # splice from another package at the same offset
            n = rng.randrange(1, 200)
            b[i:i + n] = other[i:i + n]
        elif op == 4:  # copy a range of itself elsewhere
            j, n = rng.randrange(len(b)), rng.randrange(1, 100)
            b[i:i + n] = bytes(b[j:j + n])
        elif op == 5:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 70)))
        elif op == 6:
            del b[i:i + rng.randrange(1, 70)]
        else:
            spots = [s for s in _length_fields(bytes(b)) if s[0] + struct.calcsize(s[1]) <= len(b)]
            if spots:
                off, fmt = rng.choice(spots)
                old = struct.unpack_from(fmt, b, off)[0]
                limit = 2 ** (8 * struct.calcsize(fmt)) - 1
                new = rng.choice(_EDGE + [old + 1, max(0, old - 1), old + 64, max(0, old - 64)])
                struct.pack_into(fmt, b, off, min(new, limit))
    return bytes(b)


def _alarm(signum, frame):
    raise CaseTimeout()


def run(cases: int, seed: int = 1, progress: bool = False) -> Report:
    rng = random.Random(seed)
    seeds, other = corpus()
    report = Report()
    for name, data, check in seeds:  # unmodified inputs must succeed
        check(data)
    use_alarm = hasattr(signal, "setitimer")
    old = signal.signal(signal.SIGALRM, _alarm) if use_alarm else None
    start, shown = time.perf_counter(), 0
    try:
        for n in range(cases):
            name, data, check = seeds[n % len(seeds)]
            bad = mutate(rng, data, other)
            t0 = time.perf_counter()
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, CASE_TIME_CAP_S)
            try:
                check(bad)
                if bad != data and name == "container":
                    report.accepted += 1  # the bare container is unauthenticated; a flip may still describe a graph
                elif bad == data:
                    report.unchanged += 1
                else:
                    report.findings.append(f"{name} case {n}: a mutated signed package was accepted")
            except PackageError as e:
                report.rejected[type(e).__name__] = report.rejected.get(type(e).__name__, 0) + 1
            except CaseTimeout:
                report.findings.append(f"{name} case {n}: over the {CASE_TIME_CAP_S} s cap")
            except Exception as e:  # noqa: BLE001 - any other exception is a finding
                report.findings.append(f"{name} case {n}: {type(e).__name__}: {e}"[:300])
            finally:
                if use_alarm:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            if progress and len(report.findings) > shown:
                print(report.findings[-1], flush=True)
                shown = len(report.findings)
            report.slowest_s = max(report.slowest_s, time.perf_counter() - t0)
            report.cases += 1
            if progress and report.cases % 100_000 == 0:
                print(f"{report.cases} cases, {time.perf_counter() - start:.0f} s, {len(report.findings)} findings",
                      flush=True)
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, old)
    report.seconds = time.perf_counter() - start
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", type=int, nargs="?", default=10_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-memory-gib", type=float, default=4.0, help="address-space cap (memory blow-up = finding)")
    args = parser.parse_args(argv)
    cap_address_space(args.max_memory_gib)
    report = run(args.cases, args.seed, progress=True)
    print(json.dumps({"cases": report.cases, "seconds": round(report.seconds, 1), "accepted_container_mutants": report.accepted,
                      "unchanged": report.unchanged,
                      "slowest_case_s": round(report.slowest_s, 4), "rejected": report.rejected,
                      "findings": report.findings[:50], "finding_count": len(report.findings)}, indent=1))
    return 1 if report.findings else 0


if __name__ == "__main__":
    sys.exit(main())
