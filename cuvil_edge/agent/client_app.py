"""The Flower ClientApp: verify -> build -> train or evaluate -> reply.

A site learns who it is from its node config (``site-config``: path to its
site YAML, on the deployment engine) or, in simulation, from its partition id
through the federation file named by the run spec.
"""

from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod

from cuvil_edge.agent.runtime import AgentRuntime
from cuvil_edge.config import load_federation, load_site, round_protocol as rp
from cuvil_edge.config.federation import DatasetSection
from cuvil_edge.config.home import site_state_dir
from cuvil_edge.config.round_protocol import Failure, Failures
from cuvil_edge.config.run_spec import RUN_CONFIG_KEY, RunSpec
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.datasets import digits
from cuvil_edge.datasets.records import Records
from cuvil_edge.datasets.site_files import load_site_data, model_io
from cuvil_edge.datasets.split import load_split_key, split_records
from cuvil_edge.errors import (
    BudgetExhaustedError,
    ConfigError,
    CuvilError,
    DataError,
    ModelError,
    ModelIncompatibleError,
    PackageError,
    PackageFormatError,
    PackageSizeError,
    ReplayError,
    WrongSiteError,
)
from cuvil_edge.ir.graph import Graph

log = logging.getLogger(__name__)

app = ClientApp()


def central_dp(msg: Message) -> bool:
    """Whether the coordinator runs central DP this round (it sent a clipping norm)."""
    return rp.CLIPPING_NORM in msg.content[rp.CONFIG_RECORD]


def central_dp_clipping_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower's ``fixedclipping_mod`` when the round runs central DP; otherwise a no-op.

    The mod clips (reply - received arrays) to L2 <= the server's clipping norm. It
    needs exactly one ArrayRecord and one ConfigRecord: the package travels inside
    the single "config" record, so our messages qualify.
    """
    if msg.content.config_records and central_dp(msg):
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


@lru_cache(maxsize=8)
def _site_setup(spec_path: str, partition: int | None) -> tuple[SiteConfig, int, int]:
    """In simulation a virtual node knows only its partition id: the federation file maps it to a site."""
    federation = load_federation(RunSpec.load(spec_path).federation)
    if partition is None or not 0 <= partition < len(federation.sites):
        raise ConfigError(f"node has partition-id {partition!r}; the federation lists {len(federation.sites)} sites")
    return load_site(federation.sites[partition]), partition, len(federation.sites)


def _deployed(context: Context) -> bool:
    """On the deployment engine a SuperNode's node config names its home (`cuvil-edge agent run`)."""
    return "home" in context.node_config


def _simulation_spec(context: Context) -> RunSpec:
    return RunSpec.of_simulation(dict(context.run_config))


def _agent(context: Context) -> tuple[AgentRuntime, int, int]:
    node = context.node_config
    if _deployed(context):  # everything from this device's own files, nothing from the coordinator
        site = load_site(str(node["site-config"]))
        index, count = int(node.get("partition-id", 0)), int(node.get("num-partitions", 1))
        return AgentRuntime(site, site_state_dir(site, Path(str(node["home"]))), site.agent.trust_root), index, count
    spec = _simulation_spec(context)
    partition = node.get("partition-id")
    site, index, count = _site_setup(
        str(context.run_config[RUN_CONFIG_KEY]), None if partition is None else int(partition)
    )
    key = site.agent.trust_root or Path(spec.trust_root)
    return AgentRuntime(site, site_state_dir(site, Path(spec.home)), key), index, count


def _local_dp(context: Context, site: SiteConfig) -> bool:
    """Whether this site trains with DP-SGD: its own YAML's ``privacy.local_dp`` on the deployment
    engine; in simulation, the federation's ``local_dp`` from the agent's own copy of the file.

    It is never taken from the coordinator's message: a coordinator cannot turn a
    site's local DP off remotely.
    """
    if _deployed(context):
        return site.privacy.local_dp
    return load_federation(_simulation_spec(context).federation).local_dp


def local_data(agent: AgentRuntime, index: int, count: int, context: Context, graph: Graph) -> tuple[Records, Records]:
    """(train, eval) records of this site: from its own files when its YAML's ``data`` names them
    (checked against ``graph``'s input and classes), else the demo's digits partition; split per
    record under the site's secret key in its state directory (datasets.split).

    Raises:
        DataError: the site's files are missing or unreadable, or do not fit ``graph``.
        UnsafePathError, StateError: the split key in the state directory is not private, or
            cannot be read or created.
    """
    key = load_split_key(agent.state_dir)
    if agent.site.data.kind != "digits-partition":
        return load_site_data(agent.site.data, graph, cache_dir=agent.state_dir / "data-cache", split_key=key)
    d = DatasetSection() if _deployed(context) else load_federation(_simulation_spec(context).federation).dataset
    part = digits.site_partition(
        index,
        count,
        test_fraction=d.test_fraction,
        alpha=d.dirichlet_alpha,
        seed=d.seed,
        cache_dir=agent.state_dir / "data-cache",
    )
    return split_records(part, agent.site.data.eval_fraction, key=key)


def check_model(site: SiteConfig, graph: Graph) -> None:
    """The package's model against the public metadata of the site YAML (``data.input_shape``,
    ``data.num_classes``, see :meth:`DataSection.model_metadata`), before any record is read: a
    mismatch is refused whatever the records hold, so it says nothing about them.

    Raises:
        ModelIncompatibleError: the model's record shape or classes differ from the metadata, the
            model is not one input -> one score per class, or the YAML does not state the metadata.
    """
    shape, classes = site.data.model_metadata()
    if shape is None or classes is None:
        raise ModelIncompatibleError(
            f"site {site.site}: its YAML states no data.input_shape / data.num_classes "
            f"(data.classes) for its {site.data.kind} data; every package is refused "
            "until it does"
        )
    try:
        record, outputs = model_io(graph)
    except DataError as e:
        raise ModelIncompatibleError(str(e)) from e
    if record != shape or outputs != classes:
        raise ModelIncompatibleError(
            f"site {site.site}: the package's model takes records {record} and gives "
            f"{outputs} classes; the site YAML says {shape} and {classes}"
        )


def failure_of(error: BaseException) -> Failure:
    """The code from the protocol's fixed set that a site replies with for ``error``."""
    for kind, failure in (
        (ReplayError, Failures.REPLAYED),
        (BudgetExhaustedError, Failures.BUDGET_EXHAUSTED),
        (DataError, Failures.DATA_INVALID),
        (ModelIncompatibleError, Failures.MODEL_INCOMPATIBLE),
        (PackageError, Failures.PACKAGE_REJECTED),
        (ModelError, Failures.MODEL_INCOMPATIBLE),
    ):
        if isinstance(error, kind):
            return failure
    return Failures.INTERNAL_ERROR


def _error(msg: Message, error: BaseException) -> Message:
    """A failure reply: the code and its name, nothing else; the details go to this device's log only
    (DESIGN.md §3: nothing derived from the data leaves in an error)."""
    failure = failure_of(error)
    log.warning(
        "replying %s (%d): %s: %s",
        failure.name,
        failure.code,
        type(error).__name__,
        error,
        exc_info=not isinstance(error, CuvilError),
    )
    return Message(Error(code=failure.code, reason=failure.name), reply_to=msg)


def _budget_reply(msg: Message, agent: AgentRuntime, error: BudgetExhaustedError) -> Message:
    """A clean "budget exhausted" reply: no update, the coordinator drops the site from the round.

    Under central DP the reply carries the received weights unchanged (a zero
    update) with weight 1, since Flower's accountant needs every sampled site's reply.
    """
    ledger = agent.ledger()
    central = msg.metadata.message_type == MessageType.TRAIN and central_dp(msg)
    metrics = MetricRecord(
        rp.EXHAUSTED_REPLY.metrics(
            num_examples=1 if central else 0,
            budget_exhausted=1,
            eps_spent=ledger.spent(),
            eps_remaining=ledger.remaining(),
        )
    )
    log.warning("%s", error)
    arrays = msg.content[rp.ARRAYS_RECORD] if central else ArrayRecord()
    return Message(RecordDict({rp.ARRAYS_RECORD: arrays, rp.METRICS_RECORD: metrics}), reply_to=msg)


def _package(msg: Message, agent: AgentRuntime) -> bytes:
    config = msg.content[rp.CONFIG_RECORD]
    if config.get(rp.SITE) != agent.site.site:
        raise WrongSiteError(f"message for site {config.get(rp.SITE)!r} reached site {agent.site.site!r}")
    package = config.get(rp.PACKAGE)
    if not isinstance(package, bytes):
        raise PackageFormatError(f"the message carries no package bytes under config[{rp.PACKAGE!r}]")
    if len(package) > agent.max_package_bytes:  # before anything else looks at it
        raise PackageSizeError(
            f"the message carries a {len(package)}-byte package, over this site's limit of "
            f"{agent.max_package_bytes} (agent.max_package_bytes)"
        )
    return package


@app.query()
def query(msg: Message, context: Context) -> Message:
    """Tell the coordinator which site this node is."""
    try:
        agent, _, _ = _agent(context)
    except Exception as e:  # noqa: BLE001 - a failure is a code (see _error)
        return _error(msg, e)
    return Message(RecordDict({rp.CONFIG_RECORD: ConfigRecord({rp.SITE: agent.site.site})}), reply_to=msg)


#: Reply fields measured on public inputs only (the package and this hardware, before any data
#: is touched): they are the same for neighbouring datasets up to timing noise.
DATA_INDEPENDENT_MEASUREMENTS = (rp.BUILD_SECONDS, rp.VERIFY_SECONDS)


@app.train(mods=[central_dp_clipping_mod])
def train(msg: Message, context: Context) -> Message:
    """Verify and build the package, then train locally (DP-SGD unless ``local_dp: false``).

    Everything in the reply is noised and charged (the weights) or a function of public
    configuration (the FedAvg weight from the site YAML, ε from the planned σ, q and steps,
    the ledger's totals of such events) or measured on the package before any data is used:
    nothing reveals how many records the site holds. Under central DP the FedAvg weight is 1
    for every site (Flower's accountant needs equal weights).
    """
    from cuvil_edge.agent.training import train_round

    try:
        agent, index, count = _agent(context)
        activated = agent.activate(_package(msg, agent))
        graph = activated.graph or activated.model.graph  # float weights: what training reads
        check_model(agent.site, graph)  # before any record is read
        keys = _reply_keys(msg, graph)  # before training: a bad request spends nothing
        train_data, _ = local_data(agent, index, count, context, graph)
        ledger = agent.ledger()
        config = msg.content[rp.CONFIG_RECORD]
        # the graph as loaded: fp16-stored weights widened to the float32 the trainer updates
        outcome = train_round(
            graph,
            agent.site,
            train_data,
            ledger,
            int(config[rp.SERVER_ROUND]),  # type: ignore[arg-type]  # a ConfigRecord value
            activated.package.manifest.version,
            local_dp=_local_dp(context, agent.site),
            # FedProx: Flower's strategy sends its mu; the term is free under DP-SGD
            proximal_mu=config.get(rp.PROXIMAL_MU, 0.0),
            plan_cache=agent.state_dir,
        )  # the noise search, once per device, not per message
    except BudgetExhaustedError as e:
        return _budget_reply(msg, agent, e)
    except Exception as e:  # noqa: BLE001 - a failure is a code (see _error)
        return _error(msg, e)
    metrics = MetricRecord(train_metrics(agent.site, outcome, ledger, activated, central=central_dp(msg)))
    arrays = ArrayRecord({k: Array(outcome.weights[k]) for k in keys})
    return Message(RecordDict({rp.ARRAYS_RECORD: arrays, rp.METRICS_RECORD: metrics}), reply_to=msg)


def _reply_keys(msg: Message, graph) -> list[str]:
    """The weights a train reply carries (the package's float32 weights, as ``train_round`` returns
    them): the keys received, in their order (fixedclipping_mod checks this), else the ones the
    coordinator named (a plain round sends no weights beside the package), else all of them.

    Raises:
        PackageFormatError: a requested weight is not a float32 weight of the package.
    """
    weights = [k for k, v in graph.initializers.items() if v.dtype == np.float32]
    keys = list(msg.content[rp.ARRAYS_RECORD].keys()) or [
        str(k)
        for k in msg.content[rp.CONFIG_RECORD].get(rp.REPLY_KEYS, [])  # type: ignore[union-attr]  # a list of names
    ]
    missing = sorted(set(keys) - set(weights))
    if missing:
        raise PackageFormatError(
            f"the coordinator asks for weights {missing[:3]} the package does not hold as "
            "float32; it was issued for another model"
        )
    return keys or weights


def train_metrics(site: SiteConfig, outcome, ledger, activated, *, central: bool) -> dict:
    """The metrics of a train reply; every value is public configuration, a ledger total of
    events planned from it, or measured on the package (:data:`DATA_INDEPENDENT_MEASUREMENTS`)."""
    return rp.TRAIN_REPLY.metrics(
        num_examples=1 if central else site.training.weight,
        eps_round=outcome.epsilon_round,
        eps_spent=ledger.spent(),
        eps_remaining=ledger.remaining(),
        noise_multiplier=outcome.noise_multiplier,
        local_dp=int(outcome.noise_multiplier > 0),
        build_seconds=activated.model.build_seconds,
        verify_seconds=activated.verify_seconds,
        package_bytes=activated.package_bytes,
        budget_exhausted=0,
    )


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Verify and build the package, then release noisy counts (correct, total) of the local
    evaluation: the spend is claimed (``ledger.claim``) under ``eval-r<round>-v<version>`` before the
    data is read, so a replayed message is refused, and given back if anything fails before the
    counts are noised (the reply is then a code only); the coordinator pools every site's counts."""
    try:
        agent, index, count = _agent(context)
        activated = agent.activate(_package(msg, agent))
        check_model(agent.site, activated.model.graph)  # before any record is read
        ledger = agent.ledger()
        server_round = int(msg.content[rp.CONFIG_RECORD][rp.SERVER_ROUND])  # type: ignore[arg-type]  # a ConfigRecord value
        plan = eval_mechanism(agent.site).plan(2, ledger.delta)
        with ledger.claim(
            plan.event(), key=f"eval-r{server_round}-v{activated.package.manifest.version}", round=server_round
        ):
            _, eval_data = local_data(agent, index, count, context, activated.model.graph)
            correct = agent.correct(activated.model, eval_data.x, eval_data.y)
            counts = plan.prepare(np.array([correct, len(eval_data.y)]), None, None)
            noisy_correct, noisy_total = (int(v) for v in plan.apply(counts, None))
    except BudgetExhaustedError as e:
        return _budget_reply(msg, agent, e)
    except Exception as e:  # noqa: BLE001 - a failure is a code (see _error)
        return _error(msg, e)
    metrics = MetricRecord(
        rp.EVALUATE_REPLY.metrics(
            noisy_correct=noisy_correct,
            noisy_total=noisy_total,
            count_noise_scale=float(2 / agent.site.privacy.eval_epsilon),
            eps_spent=ledger.spent(),
            eps_remaining=ledger.remaining(),
            budget_exhausted=0,
        )
    )
    return Message(RecordDict({rp.METRICS_RECORD: metrics}), reply_to=msg)


def eval_mechanism(site: SiteConfig):
    """(correct, total) under add/remove-one record: one record moves each count by at most 1, so
    the pair's L1 sensitivity is 2; ``eval_epsilon`` per release."""
    from cuvil_edge.privacy.counts import CountsMechanism

    return CountsMechanism(2, site.privacy.eval_epsilon)
