"""`cuvil-edge plan`: what the federation's model will cost on each site's device, at each precision,
and the most accurate precision that fits the site's limits.

Per site and precision (fp32, then fp16, then int8: most accurate first), the plan gives the
package bytes (the variant's real payload), the planned peak memory of one inference (the build's
memory plan, with the weights as the device holds them after loading), and, where a cost model is
given, the predicted inference latency at batch 1 and at the site's training batch and the time of
one local training round. A precision fits when the target can run it and every limit in the
site's YAML (``limits``) holds; the plan picks the first that fits and says why the ones before it
did not. A site nothing fits is flagged with the reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from cuvil_edge.config import SiteConfig
from cuvil_edge.coordinator.precision import with_precision
from cuvil_edge.device_targets import load_target
from cuvil_edge.device_targets.cost_model import predict
from cuvil_edge.device_targets.memory_plan import plan_memory
from cuvil_edge.device_targets.spec import TargetSpec
from cuvil_edge.errors import CuvilError
from cuvil_edge.ir.graph import Graph
from cuvil_edge.ir.infer import with_sizes
from cuvil_edge.ir_serialize import encode_payload
from cuvil_edge.passes.quantize import dequantize_at_load, store_fp16

#: Most accurate first: the plan takes the first one that fits.
PRECISIONS = ("fp32", "fp16", "int8")
MIB = 2**20

#: (graph, target, precision, batch) -> predicted seconds of one inference on the device.
Latency = Callable[[Graph, TargetSpec, str, int], float]


@dataclass(frozen=True)
class Option:
    """One precision on one site."""

    precision: str
    package_bytes: int
    peak_bytes: int | None  # None: the memory plan failed (see problems)
    latency_ms: float | None  # batch 1; None without a cost model
    train_batch_ms: float | None  # one forward at the site's training batch
    round_seconds: float | None  # forward + backward (~3x forward) over a local round's steps
    problems: tuple[str, ...]  # the limits it breaks, or why the target cannot run it

    @property
    def fits(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class SitePlan:
    site: str
    target: str
    options: tuple[Option, ...]
    chosen: Option | None
    reason: str


def plan_site(
    site: SiteConfig,
    variants: Mapping[str, Graph],
    latency: Latency | None = None,
    steps_per_round: int | None = None,
) -> SitePlan:
    """Plan ``site`` over the model's precision ``variants`` (precision -> the graph that is packaged).

    ``steps_per_round``: DP-SGD steps of one local round (for the round time); None leaves it out.
    """
    spec = load_target(site.target)
    options = []
    for precision in PRECISIONS:
        if precision in variants:
            options.append(_option(site, spec, precision, variants[precision], latency, steps_per_round))
    chosen = next((o for o in options if o.fits), None)
    if chosen is None:
        why = "; ".join(f"{o.precision}: {', '.join(o.problems)}" for o in options)
        return SitePlan(site.site, spec.name, tuple(options), None, f"nothing fits ({why})")
    skipped = [f"{o.precision} breaks {', '.join(o.problems)}" for o in options[: options.index(chosen)]]
    reason = "the most accurate precision" + (
        f" that fits ({'; '.join(skipped)})" if skipped else ", within every limit"
    )
    return SitePlan(site.site, spec.name, tuple(options), chosen, reason)


def _option(
    site: SiteConfig, spec: TargetSpec, precision: str, graph: Graph, latency: Latency | None, steps: int | None
) -> Option:
    problems = []
    package = len(encode_payload(graph))
    # the device dequantizes stored fp16/int8 weights once at load; it computes in fp16 only where it can
    compute = "fp16" if precision == "fp16" and spec.fp16 else "fp32"
    try:
        runnable = with_sizes(_loaded(graph), site.limits.dims)
        peak = plan_memory(runnable, spec, precision=compute, native=spec.native_kernels).peak_bytes
    except CuvilError as e:
        peak = None
        problems.append(f"no memory plan ({e})")
    batch_ms = train_ms = round_s = None
    if latency is not None and peak is not None:
        # inference runs the int8 kernels where the target has them; training always runs in float
        infer = (
            with_sizes(_loaded(graph, int8=True), site.limits.dims)
            if (precision == "int8" and spec.int8_kernels)
            else runnable
        )
        batch_ms = latency(infer, spec, compute, 1) * 1e3
        train_ms = latency(runnable, spec, compute, site.training.batch_size) * 1e3
        round_s = 3 * train_ms / 1e3 * steps if steps else None
    limits = site.limits
    if limits.download_mb is not None and package > limits.download_mb * MIB:
        problems.append(f"download {package / MIB:.2f} MiB > limits.download_mb {limits.download_mb:g}")
    if limits.memory_mb is not None and peak is not None and peak > limits.memory_mb * MIB:
        problems.append(f"memory {peak / MIB:.2f} MiB > limits.memory_mb {limits.memory_mb:g}")
    if limits.latency_ms is not None and batch_ms is not None and batch_ms > limits.latency_ms:
        problems.append(f"latency {batch_ms:.2f} ms > limits.latency_ms {limits.latency_ms:g}")
    if peak is not None and peak > spec.memory_mb * MIB:
        problems.append(f"memory {peak / MIB:.2f} MiB > the device's {spec.memory_mb} MiB")
    return Option(precision, package, peak, batch_ms, train_ms, round_s, tuple(problems))


def _loaded(graph: Graph, int8: bool = False) -> Graph:
    """The graph as the agent builds it: stored fp16/int8 weights dequantized once at load (with
    ``int8``, its QDQ-wrapped products as the integer ops first, as a target with int8 kernels runs them)."""
    return dequantize_at_load(graph, int8=int8)


def precision_variants(
    graph: Graph, calibration: Sequence[Mapping[str, np.ndarray]] | None = None, method: str = "mse"
) -> dict[str, Graph]:
    """The model as each precision's package would carry it: fp32 as given, fp16 (weights stored in
    half precision) and, with ``calibration`` samples (feed dicts), int8. int8 needs the samples for
    its activation ranges, so without them it is not offered."""
    variants = {"fp32": graph, "fp16": store_fp16(graph)}
    if calibration is not None:
        variants["int8"] = with_precision(graph, "int8", list(calibration), method)[0]
    return variants


def default_latency() -> Latency:
    """The cost model's prediction for one inference (device_targets.cost_model)."""

    def latency(graph: Graph, spec: TargetSpec, precision: str, batch: int) -> float:
        return predict(graph, spec, precision=precision, batch=batch).seconds

    return latency


def plan_federation(
    graph: Graph,
    sites: Sequence[SiteConfig],
    variants: Mapping[str, Graph] | None = None,
    latency: Latency | None = None,
) -> list[SitePlan]:
    """:func:`plan_site` for every site over ``variants`` (default: :func:`precision_variants`)."""
    variants = precision_variants(graph) if variants is None else variants
    # DP-SGD's Poisson steps: local_epochs passes at sample_rate make local_epochs / sample_rate steps
    plans = [
        plan_site(site, variants, latency, round(site.training.local_epochs / site.training.sample_rate))
        for site in sites
    ]
    if "int8" in variants:
        return plans
    return [
        replace(
            p,
            reason=p.reason + "; int8 was not planned: give the federation file a quantization."
            "calibration .npz of sample inputs to offer it",
        )
        if p.chosen is None
        else p
        for p in plans
    ]
