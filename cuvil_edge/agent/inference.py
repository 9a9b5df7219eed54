"""Private inference on the agent: verify -> build -> run -> clip -> DP release.

Neighbouring inputs differ in one row of ``x`` (replace-one: one person's record
swapped for another's). Each output row is clipped to L1 <= ``clip_l1``, so
swapping one input row moves one output row by at most 2 * clip_l1 in L1 and
leaves the others unchanged: the release's L1 sensitivity is 2 * clip_l1, and
every coordinate gets Laplace-type noise of scale 2 * clip_l1 / epsilon from
``privacy.release``, which reserves epsilon in the site's ledger first.

With ``feature=VALUE_NAME`` the release is an intermediate feature map instead:
the verified graph is cut to the nodes that value depends on (same inputs, that
value as the single output), compiled for the site's target like the package
(its own build-cache key: package digest + feature name), run, and each sample's
flattened feature row is clipped and released the same way.

Imports neither torch nor onnx (the agent's inference path must not).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from cuvil_edge.agent.runtime import AgentRuntime
from cuvil_edge.device_targets.build import CompiledModel, build
from cuvil_edge.errors import ConfigError, PrivacyError
from cuvil_edge.ir.graph import Graph, TensorType, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.passes.dead_code import live_nodes
from cuvil_edge.privacy.release import LaplaceMechanism


@dataclass(frozen=True)
class PrivateOutput:
    """A released inference output and what it cost."""

    values: np.ndarray  # noisy, float64, shape of the model output
    output_name: str
    epsilon: float
    sensitivity: float
    package_version: int
    eps_spent: float  # the site's total after this release
    eps_remaining: float


def clip_rows_l1(y: np.ndarray, bound: float) -> np.ndarray:
    """Scale every row (first axis) of ``y`` down so its L1 norm is at most ``bound``."""
    flat = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    norms = np.abs(flat).sum(axis=1, keepdims=True)
    scale = np.minimum(1.0, bound / np.maximum(norms, np.finfo(np.float64).tiny))
    return (flat * scale).reshape(np.shape(y))


def feature_names(graph: Graph) -> list[str]:
    """Values that can be released as a feature map: every node output, in graph order."""
    return [o for n in graph.nodes for o in n.outputs if o]


def feature_graph(graph: Graph, feature: str) -> Graph:
    """``graph`` cut to the nodes ``feature`` depends on, with ``feature`` as its single output.

    Raises:
        ConfigError: ``feature`` is not produced by a node of ``graph`` (names a few that are).
    """
    names = feature_names(graph)
    if feature not in names:
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
        what = "is a graph input or initializer" if feature in graph.types else "is not a value of the model"
        raise ConfigError(f"feature {feature!r} {what}; releasable values (node outputs) are: {shown}")
    cut = Graph(
        graph.name,
        graph.inputs,
        (Value(feature, graph.types[feature]),),
        graph.nodes,
        graph.initializers,
        graph.types,
        graph.opset,
    )
    nodes = live_nodes(cut)
    read = {i for n in nodes for i in n.inputs if i}
    inits = {k: v for k, v in graph.initializers.items() if k in read}
    return build_graph(f"{graph.name}:{feature}", graph.inputs, [feature], nodes, inits, graph.opset)


@dataclass(frozen=True)
class _FeatureBuild:
    graph: Graph
    payload_digest: str


def _build_feature(runtime: AgentRuntime, package, feature: str) -> CompiledModel:
    """Compile the feature graph for the site's target; cache key from package digest + feature name."""
    digest = hashlib.sha256(f"{package.payload_digest}\0feature\0{feature}".encode()).hexdigest()
    return build(
        _FeatureBuild(feature_graph(package.graph, feature), digest),
        runtime.target.name,
        cache_dir=runtime.state_dir / "build-cache",
        precision=runtime.site.precision,
    )


def request_key(package_digest: str, x: np.ndarray, epsilon: float, clip_l1: float, feature: str | None) -> str:
    """The default ledger key of an inference request: its package, input bytes and release
    parameters. An identical request replayed is refused instead of released again with fresh
    noise (averaging replays would erode the guarantee); a deliberate second release of the same
    batch passes its own ``key``."""
    h = hashlib.sha256()
    for part in (
        package_digest,
        str(x.dtype),
        repr(x.shape),
        repr(float(epsilon)),
        repr(float(clip_l1)),
        feature or "",
    ):
        h.update(part.encode() + b"\0")
    h.update(np.ascontiguousarray(x).tobytes())
    return f"infer-{h.hexdigest()[:40]}"


def planned_output_size(graph: Graph, x: np.ndarray) -> int:
    """Elements of the graph's first output for the batch ``x``, by shape inference alone (no data).

    Raises:
        ExecutionError / ModelError: ``x`` does not fit the model's input.
        PrivacyError: the output shape is not determined by the input shape.
    """
    inp = graph.inputs[0]
    typed = build_graph(
        graph.name,
        [Value(inp.name, TensorType(inp.type.dtype, tuple(int(d) for d in x.shape)))],
        [graph.outputs[0].name],
        graph.nodes,
        graph.initializers,
        graph.opset,
    )
    shape = typed.outputs[0].type.shape
    if not all(isinstance(d, int) for d in shape) or not shape or shape[0] != len(x):
        raise PrivacyError(
            f"output {typed.outputs[0].name} has shape {list(shape)} for a batch of {len(x)}; a "
            "release needs one output row per input row and a shape known before running"
        )
    return int(np.prod([int(d) for d in shape]))


def zero_nonfinite_rows(y: np.ndarray) -> np.ndarray:
    """Rows holding NaN or infinity become zero rows, so a non-finite output never makes the
    release fail (a refusal that depends on the data would itself leak)."""
    flat = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    bad = ~np.isfinite(flat).all(axis=1)
    return np.where(bad[:, None], 0.0, flat).reshape(np.shape(y))  # type: ignore[index]  # bad is an array


def infer_private(
    runtime: AgentRuntime,
    package_bytes: bytes,
    x: np.ndarray,
    epsilon: float,
    *,
    clip_l1: float = 1.0,
    key: str | None = None,
    feature: str | None = None,
) -> PrivateOutput:
    """Verify and build ``package_bytes``, claim the release, run it on ``x`` and release the output under ε-DP.

    ``x`` is a batch (first axis = one record per row) in the model's input shape. The spend
    is reserved in the site's ledger under ``key`` (default :func:`request_key`) *before* the
    model touches ``x``; the claim is exclusive, so a replayed request is refused. If the run
    fails, the reservation is given back (nothing left the device). Non-finite output rows are
    zeroed, every row is scaled to L1 <= ``clip_l1``, and the whole output is released with
    L1 sensitivity 2 * ``clip_l1`` (replace-one: one row changes). The softmax outputs of a
    classifier have L1 = 1, so ``clip_l1=1`` keeps them intact.

    ``feature`` names an intermediate value (a node output) to release instead of
    the model output: each sample's feature map, flattened, is clipped to L1 <=
    ``clip_l1`` (sensitivity 2 * ``clip_l1`` as for outputs). Feature maps are
    unbounded activations, so choose ``clip_l1`` for their scale.

    Raises:
        PackageError: the package failed verification (nothing is spent).
        ConfigError: ``feature`` is not a node output of the model (nothing is spent).
        ExecutionError: ``x`` does not fit the model's input (nothing is spent).
        PrivacyError: invalid ``epsilon``, ``clip_l1`` or ``x``.
        ReplayError: this request (``key``) was already released.
        BudgetExhaustedError: the site's budget would be exceeded (nothing released).
        LedgerError: the ledger is unreadable or cannot be written.
    """
    if not (isinstance(clip_l1, (int, float)) and np.isfinite(clip_l1) and clip_l1 > 0):
        raise PrivacyError(f"clip_l1 must be a positive finite number, got {clip_l1!r}")
    x = np.asarray(x)
    if x.ndim < 1 or len(x) == 0 or not np.issubdtype(x.dtype, np.number):
        raise PrivacyError(f"input must be a non-empty numeric batch, got dtype {x.dtype} shape {x.shape}")
    activated = runtime.activate(package_bytes)  # re-delivering the accepted package is idempotent
    model = activated.model if feature is None else _build_feature(runtime, activated.package, feature)
    feed = {model.graph.inputs[0].name: np.ascontiguousarray(x, dtype=np.float32)}
    size = planned_output_size(model.graph, feed[model.graph.inputs[0].name])
    sensitivity = 2.0 * float(clip_l1)
    ledger = runtime.ledger()
    key = key or request_key(activated.package.manifest_digest, x, epsilon, clip_l1, feature)
    plan = LaplaceMechanism(sensitivity, epsilon).plan(size, ledger.delta)
    with ledger.claim(plan.event(), key=key):  # aborted if the run fails: nothing computed from x left
        name, y = next(iter(model.run(feed).items()))
        noisy = plan.apply(plan.prepare(clip_rows_l1(zero_nonfinite_rows(y), float(clip_l1)), None, None), None)
    return PrivateOutput(
        np.asarray(noisy).reshape(y.shape),
        name,
        float(epsilon),
        sensitivity,
        activated.package.manifest.version,
        ledger.spent(),
        ledger.remaining(),
    )
