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
from cuvil_edge.ir.graph import Graph, Value
from cuvil_edge.ir.infer import build_graph
from cuvil_edge.passes.dead_code import live_nodes
from cuvil_edge.privacy import release


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
    cut = Graph(graph.name, graph.inputs, (Value(feature, graph.types[feature]),), graph.nodes,
                graph.initializers, graph.types, graph.opset)
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
    return build(_FeatureBuild(feature_graph(package.graph, feature), digest), runtime.target.name,
                 cache_dir=runtime.state_dir / "build-cache", precision=runtime.site.precision)


def infer_private(runtime: AgentRuntime, package_bytes: bytes, x: np.ndarray, epsilon: float, *,
                  clip_l1: float = 1.0, key: str | None = None, feature: str | None = None) -> PrivateOutput:
    """Verify and build ``package_bytes``, run it on ``x`` and release the output under ε-DP.

    ``x`` is a batch (first axis = one record per row) in the model's input
    shape. Nothing is released, and nothing spent, unless verification, build
    and execution succeed. The softmax outputs of a classifier have L1 = 1, so
    ``clip_l1=1`` keeps them intact.

    ``feature`` names an intermediate value (a node output) to release instead of
    the model output: each sample's feature map, flattened, is clipped to L1 <=
    ``clip_l1`` (sensitivity 2 * ``clip_l1`` as for outputs). Feature maps are
    unbounded activations, so choose ``clip_l1`` for their scale.

    Raises:
        PackageError: the package failed verification (nothing is spent).
        ConfigError: ``feature`` is not a node output of the model (nothing is spent).
        ExecutionError: ``x`` does not fit the model's input.
        PrivacyError: invalid ``epsilon``, ``clip_l1`` or ``x``.
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
    name, y = next(iter(model.run(feed).items()))
    if y.shape[:1] != x.shape[:1]:
        raise PrivacyError(f"output {name} has shape {y.shape}; row-wise clipping needs one output row per "
                           f"input row ({len(x)})")
    sensitivity = 2.0 * float(clip_l1)
    ledger = runtime.ledger()
    noisy = release(clip_rows_l1(y, float(clip_l1)), sensitivity=sensitivity, epsilon=epsilon, ledger=ledger,
                    key=key)
    return PrivateOutput(np.asarray(noisy), name, float(epsilon), sensitivity,
                         activated.package.manifest.version, ledger.spent(), ledger.remaining())
