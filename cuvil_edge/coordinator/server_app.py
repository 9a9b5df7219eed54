"""The Flower ServerApp: load the federation, run its Flower strategy with per-site packages, report."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from threadpoolctl import threadpool_limits

from cuvil_edge.config import load_federation
from cuvil_edge.config.federation import FederationConfig
from cuvil_edge.config.home import versions_file
from cuvil_edge.config.run_spec import RUN_CONFIG_KEY, RunSpec
from cuvil_edge.coordinator.checkpoints import latest_checkpoint, resumed
from cuvil_edge.coordinator.keys import load_signing_keys
from cuvil_edge.coordinator.model import load_federation_model
from cuvil_edge.coordinator.packaging import PackageFactory, VersionCounter
from cuvil_edge.coordinator.plan import default_latency, plan_federation, precision_variants
from cuvil_edge.coordinator.precision import federation_calibration
from cuvil_edge.coordinator.registry import SiteRegistry
from cuvil_edge.coordinator.report import STOPPED_CENTRAL_BUDGET, RunReport, log as log_report, show_round_table
from cuvil_edge.coordinator.round_recorder import Checkpointing
from cuvil_edge.coordinator.server_optimiser import restore_optimiser
from cuvil_edge.coordinator.strategy import CentralDpFixedClipping, SitePackages, arrays_to_numpy, flower_strategy
from cuvil_edge.datasets import digits
from cuvil_edge.datasets.site_files import load_records
from cuvil_edge.errors import CuvilError, StateError
from cuvil_edge.ir import interpreter

log = logging.getLogger(__name__)

app = ServerApp()


class NoSiteTrainedError(CuvilError):
    """Every round of a run ended without one site's training reply: nothing was learnt."""


@app.main()
def main(grid: Grid, context: Context) -> None:
    show_round_table()
    config = dict(context.run_config)
    if config.get(RUN_CONFIG_KEY):  # simulation: the launcher's run spec (already resumed by prepare_run)
        spec = RunSpec.of_simulation(config)
    else:  # deployment engine: the settings come in the run config
        spec = RunSpec.from_run_config(config)
        spec = resumed(spec, int(config.get("rounds") or 0) or None) if config.get("resume") else spec
    # Flower's simulation engine starts Ray's processes (fork + exec) from another thread of this
    # process while the ServerApp runs; OpenBLAS' fork handler then deadlocks against a threaded BLAS
    # call in flight (seen: GPTQ's matrix inverse during Ray's start-up hung the run). The
    # coordinator's linear algebra is small, so it runs on one BLAS thread.
    with threadpool_limits(limits=1, user_api="blas"):
        run_federation(grid, spec)


def run_federation(grid: Grid, spec: RunSpec) -> RunReport:
    """Drive all rounds of the federation described by ``spec``."""
    federation = load_federation(spec.federation)
    sites = federation.load_sites()
    graph = load_federation_model(federation.model, federation.seed)
    run_dir = Path(spec.run_dir)
    # each site's compile plan: the most accurate precision that fits its limits (fp32, else fp16
    # storage, else int8 when the federation gives calibration samples), and a site nothing fits is
    # sent nothing while the run goes on
    quantization = federation.quantization
    calibration = federation_calibration(quantization.calibration, graph)
    plans = plan_federation(
        graph, sites, precision_variants(graph, calibration, quantization.method), default_latency()
    )
    refused = {p.site: p.reason for p in plans if p.chosen is None}
    precisions = {p.site: p.chosen.precision for p in plans if p.chosen is not None}
    for site, why in refused.items():
        log.warning("site %r: %s; the run goes on without it", site, why)
    for plan in plans:
        if plan.chosen is not None and plan.chosen.precision != "fp32":
            log.info("site %r gets %s packages: %s", plan.site, plan.chosen.precision, plan.reason)
    factory = PackageFactory(
        graph,
        sites,
        load_signing_keys(Path(spec.coordinator_key)),
        VersionCounter(versions_file(Path(spec.home))),
        federation.package.validity_seconds,
        seal_keys=SiteRegistry(Path(spec.home)).seal_keys(),  # enrolled sites: sealed
        refused=refused,
        precisions=precisions,
        calibration=calibration,
        quantization_method=quantization.method,
    )
    sites_strategy, strategy = make_strategy(federation, factory, len(sites))
    dataset = federation.dataset
    test = load_records(dataset.test, graph) if dataset.test else digits.global_test(dataset.test_fraction)
    report = RunReport(run_dir, sites)
    trainable = {k: v for k, v in graph.initializers.items() if v.dtype == np.float32}
    offset = spec.start_round  # a resumed run numbers its rounds on from its checkpoint
    if offset:
        checkpoint = latest_checkpoint(Path(spec.home), federation.name)
        if checkpoint is None or checkpoint.round != offset or set(checkpoint.weights) != set(trainable):
            raise StateError(
                f"the checkpoint of round {offset} of {federation.name!r} is missing or does not "
                "match the model; cannot resume"
            )
        trainable = checkpoint.weights
        restore_accountant(strategy, checkpoint, federation.name)
        if restore_optimiser(sites_strategy.strategy, checkpoint.optimiser, trainable):
            log.info("resumed %s's optimiser state from round %d", type(sites_strategy.strategy).__name__, offset)
        sites_strategy.round_offset = offset
        log_report.info(
            "resuming %s after round %d of %d: %d round%s left",
            federation.name,
            offset,
            offset + spec.rounds,
            spec.rounds,
            "" if spec.rounds == 1 else "s",
        )
    # each completed round: its checkpoint (weights, central-DP releases, server optimiser), then its row
    sites_strategy.recorder.report = report
    sites_strategy.recorder.checkpoints = Checkpointing(
        Path(spec.home),
        federation.name,
        offset + spec.rounds,
        accountant=getattr(strategy, "accountant", None),
        optimiser=sites_strategy.strategy,
        trainable=trainable,
    )

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        weights = arrays_to_numpy(arrays)
        model = factory.graph_with(weights)
        probs = interpreter.run(model, {model.inputs[0].name: test.x})[model.outputs[0].name]
        accuracy = float((probs.argmax(axis=1) == test.y).mean())
        sites_strategy.recorder.round_done(server_round, accuracy, weights)
        return MetricRecord({"accuracy": accuracy})

    start_rounds(
        strategy,
        report,
        grid,
        ArrayRecord({k: Array(np.array(v)) for k, v in trainable.items()}),
        num_rounds=spec.rounds,
        timeout=federation.round_timeout,
        evaluate_fn=evaluate,
    )
    report.plot()
    untrained = report.no_site_trained()
    if untrained:  # the rounds "completed", but the model is the one sent out: the run failed
        raise NoSiteTrainedError(untrained)
    return report


def restore_accountant(strategy, checkpoint, federation: str) -> None:
    """Give a resumed run's central-DP accountant the releases made before the checkpoint, so ε
    (and ``central_dp.max_epsilon``) count from where the run stopped, not from zero.

    Raises:
        StateError: central DP is on but the checkpoint does not record the releases so far, or
            they were accounted under another privacy configuration (δ, number of sites; only
            ``max_epsilon`` may change on resume).
    """
    accountant = getattr(strategy, "accountant", None)
    if accountant is None:
        return
    if checkpoint.accountant is None:
        raise StateError(
            f"the checkpoint of round {checkpoint.round} of {federation!r} does not record the central-DP "
            "releases made so far, so a resumed run would count ε from zero; start the federation "
            "afresh (a new --home or federation name)"
        )
    try:
        state = dict(checkpoint.accountant)  # max_epsilon, a cap on what comes next, may change on resume
        state["config"] = {**state["config"], "max_epsilon": accountant.state_dict()["config"]["max_epsilon"]}
        accountant.load_state_dict(state)
    except (ValueError, TypeError, KeyError) as e:
        raise StateError(
            f"the checkpoint of round {checkpoint.round} of {federation!r} accounted central DP under "
            f"another configuration ({e}); resume with the federation file it ran with"
        ) from e


def start_rounds(
    strategy, report: RunReport, grid, arrays: ArrayRecord, *, num_rounds: int, timeout: float, evaluate_fn
) -> None:
    """``strategy.start(...)``; a central-DP budget stop ends the run cleanly instead of failing it.

    Flower's accountant raises ``PrivacyBudgetExhausted`` in ``configure_train``,
    before any site is asked to train, when the next round's release would take
    the central ε above ``central_dp.max_epsilon``. The rounds reported so far
    stand; the report records why the run stopped (metrics.json ``stopped_early``).
    """
    from flwr.serverapp.exception import PrivacyBudgetExhausted

    try:
        strategy.start(grid, arrays, num_rounds=num_rounds, timeout=timeout, evaluate_fn=evaluate_fn)
    except PrivacyBudgetExhausted as e:
        report.stop_early(STOPPED_CENTRAL_BUDGET, str(e), requested_rounds=num_rounds)


def make_strategy(federation: FederationConfig, factory: PackageFactory, n: int):
    """(the per-site layer, the strategy to run): the same object unless central DP wraps it.

    The per-site layer wraps the Flower strategy the federation's ``strategy`` section names,
    with its parameters. Central DP accounts with Flower's RDP accountant (needs
    ``dp-accounting``) for sampling every site every round (NO_AMPLIFICATION), add-or-remove-one
    site; ``central_dp.max_epsilon`` (if set) becomes the accountant's ``max_epsilon``, so Flower
    refuses a round that would exceed it (see :func:`start_rounds`).
    """
    needed = federation.min_sites or n  # fewer than all: a site that is down does not stall the run
    sampling = dict(
        fraction_train=1.0,
        fraction_evaluate=1.0,
        min_train_nodes=needed,
        min_evaluate_nodes=needed,
        min_available_nodes=needed,
    )
    chosen = federation.strategy
    sites = SitePackages(factory, flower_strategy(chosen.name, chosen.flower_kwargs(), **sampling))
    dp = federation.central_dp
    if not dp.enabled:
        return sites, sites
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    accountant = RdpAccountant(
        PrivacyConfig(
            target_delta=dp.delta,
            population_size=n,
            neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
            sampling_method=SamplingMethod.NO_AMPLIFICATION,
            max_epsilon=dp.max_epsilon,
        )
    )
    return sites, CentralDpFixedClipping(
        sites,
        noise_multiplier=dp.noise_multiplier,
        clipping_norm=dp.clipping_norm,
        num_sampled_clients=n,
        accountant=accountant,
    )
