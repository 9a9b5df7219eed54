"""Per-node profiles for bench_compiled.py: the compiled module timed node by node (a copy of its
``_forward`` with a clock read around each node's statements) and onnxruntime's own profiler, both
summed by op type and by convolution layer kind (kernel, stride) so the two read side by side."""

from __future__ import annotations

import ast
import copy
import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import numpy as np

from cuvil_edge.ir import cost

# ---------------------------------------------------------------- per-node profile of the compiled module

_MARK = re.compile(r"^\s*# (\S+) node (.+)$")


def _instrumented(source: str, function: ast.FunctionDef) -> tuple[ast.FunctionDef, list[dict]]:
    """A copy of ``function`` whose top-level statements are grouped by the node comment before
    them and each group wrapped in clock reads; the groups' labels."""
    lines = source.splitlines()
    marks = []  # (line number, op type, node name) inside the function
    for lineno in range(function.lineno, (function.end_lineno or function.lineno) + 1):
        m = _MARK.match(lines[lineno - 1])
        if m:
            marks.append((lineno, m.group(1), m.group(2)))
    groups: list[dict] = []
    body: list[ast.stmt] = []
    current: list[ast.stmt] = []

    def flush() -> None:
        if not current:
            return
        idx = len(groups) - 1
        body.append(ast.parse("_cuv_t0 = _cuv_clock()").body[0])
        body.extend(current)
        body.append(ast.parse(f"_cuv_record({idx}, _cuv_clock() - _cuv_t0)").body[0])
        current.clear()

    label = None
    for stmt in function.body:
        before = [m for m in marks if m[0] < stmt.lineno]
        inside = [m for m in marks if stmt.lineno <= m[0] <= (stmt.end_lineno or stmt.lineno)]
        if isinstance(stmt, ast.Return):
            flush()
            body.append(stmt)
            continue
        if inside:  # a compound statement holding several nodes' code: one group for all of them
            new = ("+".join(sorted({m[1] for m in inside})), ", ".join(m[2] for m in inside))
        elif before:
            new = (before[-1][1], before[-1][2])
        else:
            new = ("(inputs and weights)", "")
        if new != label or inside:
            flush()
            label = new
            groups.append({"op_type": new[0], "node": new[1], "kernel": None})
        call = stmt.value if isinstance(stmt, ast.Assign) else None
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and groups[-1]["kernel"] is None:
            groups[-1]["kernel"] = call.func.id
        current.append(stmt)
    flush()
    timed = copy.copy(function)
    timed.body, timed.decorator_list = body, []
    return ast.fix_missing_locations(timed), groups


def profile_compiled(compiled, feeds: dict[str, np.ndarray], graph, batch: int, runs: int,
                     between: Callable[[], object] = lambda: None) -> dict:
    """Per node and per op type: median ms over ``runs`` calls of ``compiled.run`` with every
    function of the module that holds node comments (``_forward``) swapped for a timed copy;
    ``between`` runs after each (onnxruntime's profiled run, so the two see the same machine load)."""
    namespace = compiled._entry.__globals__
    tree = ast.parse(compiled.source)
    targets = [f for f in tree.body if isinstance(f, ast.FunctionDef)
               and any(_MARK.match(line) for line in
                       compiled.source.splitlines()[f.lineno - 1:f.end_lineno])]
    if not targets:
        raise SystemExit("profile: no function of the compiled module has '# <Op> node <name>' comments")
    groups: list[dict] = []
    timed = {}
    for function in targets:
        fn_copy, labels = _instrumented(compiled.source, function)
        offset = len(groups)
        # each function records into its own slice of the groups
        fn_copy = ast.fix_missing_locations(_Offset(offset).visit(fn_copy))
        groups += labels
        timed[function.name] = fn_copy
    acc = np.zeros((runs, len(groups)))
    row = [0]

    def record(index: int, seconds: float) -> None:
        acc[row[0], index] += seconds

    originals = {name: namespace[name] for name in timed}
    namespace["_cuv_clock"], namespace["_cuv_record"] = time.perf_counter, record
    try:
        for name, fn_copy in timed.items():
            exec(compile(ast.Module(body=[fn_copy], type_ignores=[]), compiled.source_path.as_posix(), "exec"),
                 namespace)
        compiled.run(feeds)  # warm
        totals = []
        for r in range(runs):
            row[0] = r
            start = time.perf_counter()
            compiled.run(feeds)
            totals.append(time.perf_counter() - start)
            between()
    finally:
        namespace.update(originals)
        for key in ("_cuv_clock", "_cuv_record"):
            namespace.pop(key, None)
    plain = []
    for _ in range(runs):
        start = time.perf_counter()
        compiled.run(feeds)
        plain.append(time.perf_counter() - start)
    try:
        flops = cost.node_flops(graph, {s: batch for t in graph.types.values() for s in t.symbols()})
    except Exception:  # noqa: BLE001 - FLOPs are a nicety of the report
        flops = {}
    node_ms = np.median(acc, axis=0) * 1e3
    by_name = {n.name: n for n in graph.nodes}
    nodes = []
    for g, ms in zip(groups, node_ms):
        try:
            key = ast.literal_eval(g["node"])
        except (ValueError, SyntaxError):
            key = g["node"]
        nodes.append({**g, "node": key, "kind": _kind(graph, by_name.get(key), g["op_type"]),
                      "layer": _layer(_kind(graph, by_name.get(key), g["op_type"])), "ms": float(ms),
                      "flops": int(flops.get(key, 0))})
    attributed = float(node_ms.sum())

    def table(field: str) -> dict[str, dict]:
        out: dict[str, dict] = defaultdict(lambda: {"count": 0, "ms": 0.0, "flops": 0})
        for n in nodes:
            t = out[n[field]]
            t["count"] += 1
            t["ms"] += n["ms"]
            t["flops"] += n["flops"]
        for t in out.values():
            t["share"] = t["ms"] / attributed if attributed else 0.0
            t["gflops_per_s"] = t["flops"] / (t["ms"] * 1e6) if t["ms"] > 0 and t["flops"] else None
        return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))

    return {
        "batch": batch, "runs": runs,
        "run_ms_plain": float(np.median(plain) * 1e3),
        "run_ms_instrumented": float(np.median(totals) * 1e3),
        "nodes_ms": attributed,  # sum of the nodes' medians; shares are of this
        # run() around _forward, bind_inputs, the clock reads themselves: median over runs
        "unattributed_ms": float(np.median(np.asarray(totals) - acc.sum(axis=1)) * 1e3),
        "by_op_type": table("op_type"),
        "by_kind": table("kind"),  # convolutions split by shape: depthwise / 1x1 / kxk, stride
        "by_layer": table("layer"),  # the same, Conv and CuvilFusedConv together (as onnxruntime's)
        "top_nodes": sorted(nodes, key=lambda n: -n["ms"])[:15],
    }


def _kind(graph, node, op_type: str) -> str:
    """``op_type``, and for a convolution whether it is depthwise, 1x1 or kxk and its stride."""
    if node is None or "Conv" not in op_type or len(node.inputs) < 2 or node.inputs[1] not in graph.types:
        return op_type
    shape = graph.types[node.inputs[1]].shape
    if len(shape) < 3:
        return op_type
    group = int(node.attr("group", 1) or 1)
    kernel = "x".join(str(k) for k in shape[2:])
    strides = node.attr("strides") or ()
    stride = f" /{max(strides)}" if strides and max(strides) > 1 else ""
    if group > 1 and group == shape[0]:
        return f"{op_type} depthwise {kernel}{stride}"
    return f"{op_type} {kernel}{' grouped' if group > 1 else ''}{stride}"


class _Offset(ast.NodeTransformer):
    """Shift the group index of every _cuv_record call by ``offset``."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "_cuv_record" and self.offset:
            node.args[0] = ast.Constant(node.args[0].value + self.offset)
        return node


def _layer(kind: str) -> str:
    """A convolution kind without its op type (Conv and CuvilFusedConv alike): "conv 3x3 /2"."""
    op, _, rest = kind.partition(" ")
    return f"conv {rest}" if "Conv" in op and rest else kind


def profile_onnxruntime(session, graph, total_runs: int) -> dict:
    """onnxruntime's own per-node kernel times over the ``total_runs`` runs ``session`` (made with
    profiling on) has made, ms per run by op type, and its convolutions by layer kind: its node
    names are the names of the values they write (``<value>_nchwc`` after its layout pass), looked
    up in ``graph`` (the optimised IR graph, whose fused convolutions write the same values or keep
    the convolution's node name)."""
    path = session.end_profiling()
    events = json.loads(Path(path).read_text())
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    # a residual convolution's value is gone from ours (CuvilConvAdd writes the Add's or Relu's):
    # found by the node, which keeps the exported Conv's name ("<name>_output_0" is its value)
    by_name = {n.name: n for n in graph.nodes}
    per_run: dict[str, list[float]] = defaultdict(list)
    per_node: dict[tuple[str, str], list[float]] = defaultdict(list)  # (layer kind, node): its runs
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
            op = e["args"].get("op_name", "?")
            per_run[op].append(e["dur"] / 1e3)
            value = e["name"][:-len("_kernel_time")]
            value = value[:-len("_nchwc")] if value.endswith("_nchwc") else value
            node = producer.get(value) or by_name.get(value.removesuffix("_output_0"))
            if op == "Conv" and node is not None:
                per_node[_layer(_kind(graph, node, node.op_type)), value].append(e["dur"] / 1e3)
    Path(path).unlink(missing_ok=True)
    layers: dict[str, dict] = defaultdict(lambda: {"count": 0, "ms": 0.0})
    for (layer, _), runs in per_node.items():  # per node the median over runs, as for ours
        layers[layer]["count"] += 1
        layers[layer]["ms"] += float(np.median(runs))
    by_type = {k: {"count": len(v) // total_runs, "ms": sum(v) / total_runs} for k, v in per_run.items()}
    return {"by_op_type": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["ms"])),
            "by_layer": dict(sorted(layers.items(), key=lambda kv: -kv[1]["ms"]))}


def layer_rows(prof: dict) -> list[dict]:
    """Per convolution layer kind: ours and onnxruntime's ms and GFLOP/s (FLOPs from
    cuvil_edge.ir.cost over the same layers), and the ratio of the rates."""
    ours, theirs = prof["compiled"]["by_layer"], prof["onnxruntime"]["by_layer"]
    rows = []
    for layer, t in ours.items():
        if not layer.startswith("conv") or layer not in theirs or not t["flops"]:
            continue
        o = theirs[layer]
        rate, ort_rate = t["flops"] / (t["ms"] * 1e6), t["flops"] / (o["ms"] * 1e6) if o["ms"] else 0.0
        rows.append({"layer": layer, "count": t["count"], "ms": t["ms"], "gflops_per_s": rate, "ort_ms": o["ms"],
                     "ort_gflops_per_s": ort_rate, "of_ort": rate / ort_rate if ort_rate else None})
    return rows


def print_profile(name: str, prof: dict) -> None:
    c = prof["compiled"]
    print(f"\nprofile {name} batch {c['batch']}: run {c['run_ms_plain']:.3f} ms plain, "
          f"{c['run_ms_instrumented']:.3f} ms instrumented, {c['unattributed_ms']:.3f} ms outside the nodes")
    for title, key in (("op type", "by_op_type"), ("convolutions by kind", "by_kind")):
        print(f"  {title:36s} {'n':>4s} {'ms':>9s} {'share':>6s} {'GFLOP/s':>8s}")
        for op, t in c[key].items():
            if key == "by_kind" and "Conv" not in op:
                continue
            rate = f"{t['gflops_per_s']:.1f}" if t["gflops_per_s"] else ""
            print(f"  {op:36s} {t['count']:4d} {t['ms']:9.3f} {t['share']:6.1%} {rate:>8s}")
    print("  top nodes: " + "; ".join(f"{n['op_type']} {n['node']} {n['ms']:.3f} ms" for n in c["top_nodes"][:6]))
    print("  onnxruntime kernels: " + ", ".join(f"{op} {t['ms']:.3f} ms ({t['count']})"
                                                 for op, t in prof["onnxruntime"]["by_op_type"].items()))
    print(f"  {'convolution layers':24s} {'n':>3s} {'ours ms':>8s} {'GFLOP/s':>8s} {'ORT ms':>8s} {'GFLOP/s':>8s} "
          f"{'of ORT':>7s}")
    for r in layer_rows(prof):
        print(f"  {r['layer']:24s} {r['count']:3d} {r['ms']:8.3f} {r['gflops_per_s']:8.1f} {r['ort_ms']:8.3f} "
              f"{r['ort_gflops_per_s']:8.1f} {r['of_ort']:7.0%}")


