"""The per-site package layer around whichever Flower strategy the federation chose.

:class:`SitePackages` wraps a Flower strategy (FedAvg, FedProx, FedAdam, FedYogi or FedAvgM,
see :func:`flower_strategy`) by composition, as Flower's DP wrappers do. The wrapped strategy
samples nodes, builds the round's config and aggregates; this layer only (1) learns which site
each node is with a QUERY message, (2) swaps the shared message content for a per-site one
carrying that site's package, (3) keeps per-site round statistics, dropping sites that reply
"budget exhausted" from the average instead of failing the round, and (4) moves replies of
sites sent rounded (fp16/int8) weights onto the exact weights before the strategy sees them.

With central DP, :class:`CentralDpFixedClipping` (Flower's
``DifferentialPrivacyClientSideFixedClipping``) wraps this layer; Flower's accountant checks
the strategy inside, whose ``aggregate_train`` must be FedAvg's (fedavg or fedprox).
"""

from __future__ import annotations

import logging
import time
from typing import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (DifferentialPrivacyClientSideFixedClipping, FedAdam, FedAvg, FedAvgM,
                                     FedProx, FedYogi, Strategy)

from cuvil_edge.config import round_protocol as rp
from cuvil_edge.config.round_protocol import failure_text
from cuvil_edge.coordinator.evaluation import SiteCounts, clip01, pool
from cuvil_edge.coordinator.packaging import FrozenWeights, PackageFactory
from cuvil_edge.coordinator.report import EXHAUSTED_STATUS, FAILED_STATUS, NOT_PUSHED_STATUS

log = logging.getLogger(__name__)

#: Keys of the round's messages: config/round_protocol.py, shared with the agent (never spelled here).
PACKAGE_KEY, SITE_KEY, EXHAUSTED_METRIC = rp.PACKAGE, rp.SITE, rp.BUDGET_EXHAUSTED
REPLY_KEYS, CLIPPING_NORM_KEY = rp.REPLY_KEYS, rp.CLIPPING_NORM

#: The federation YAML's ``strategy.name`` -> Flower's strategy class (never a copy of one).
FLOWER_STRATEGIES: dict[str, type[FedAvg]] = {"fedavg": FedAvg, "fedprox": FedProx, "fedadam": FedAdam,
                                              "fedyogi": FedYogi, "fedavgm": FedAvgM}


def flower_strategy(name: str, parameters: dict, **sampling) -> FedAvg:
    """Flower's strategy ``name`` with its own ``parameters`` (validated by the federation schema)
    and the sampling settings (``fraction_train``, ``min_train_nodes``, ...)."""
    return FLOWER_STRATEGIES[name](**sampling, **parameters)


def arrays_to_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in arrays.items()}


class SitePackages(Strategy):
    """A Flower strategy whose messages each carry the receiving site's own signed package.

    ``strategy`` is the Flower strategy that samples and aggregates (default: ``FedAvg`` built
    from ``fedavg_kwargs``). Training replies are recorded, exhausted sites dropped and rounded
    replies re-anchored before ``strategy.aggregate_train`` sees them; under central DP the
    wrapper takes the replies itself first (see :class:`CentralDpFixedClipping`).
    """

    def __init__(self, factory: PackageFactory, strategy: Strategy | None = None, **fedavg_kwargs) -> None:
        if strategy is not None and fedavg_kwargs:
            raise TypeError("give a Flower strategy or FedAvg's keyword arguments, not both")
        self.strategy = strategy if strategy is not None else FedAvg(**fedavg_kwargs)
        self.factory = factory
        #: Set by CentralDpFixedClipping: it takes the train replies before Flower validates them.
        self.central_dp = False
        self.node_to_site: dict[int, str] = {}
        self.rounds: dict[int, dict] = {}  # round -> site -> statistics
        self.central: dict[int, dict] = {}  # round -> central-DP accounting (CentralDpFixedClipping)
        self.evaluations: dict[int, dict] = {}  # round -> pooled federated accuracy (aggregate_evaluate)
        self._sent: list[tuple[Message, str]] = []  # messages of the current phase and their sites
        self._weights: FrozenWeights | None = None  # the global weights the current phase sent
        self.timings: dict[int, dict] = {}  # round -> seconds the coordinator spent per phase
        #: Rounds completed before this run (a resumed one): the wrapped strategy's aggregation counts
        #: on from there (FedAdam's bias correction depends on the round number).
        self.round_offset = 0

    # -- node -> site ---------------------------------------------------------
    def _resolve_sites(self, grid: Grid, node_ids: Iterable[int]) -> None:
        """Learn which site each node is. On the deployment engine with node authentication a
        node *is* the name it was registered under (`coordinator serve` registers each enrolled
        site's key under the site's name); only without registered names (simulation) is the node
        asked with a QUERY. Two nodes can never be one site."""
        node_ids = list(node_ids)
        unknown = [nid for nid in node_ids if nid not in self.node_to_site]
        if not unknown:
            return
        names = self._registered_names(grid)
        if names:
            for nid in unknown:
                site = names.get(nid, "")
                if site in self.factory.sites:
                    self._bind(nid, site, node_ids)
                else:
                    log.warning("node %s is registered as %r, not an enrolled site; it gets nothing", nid, site)
            return
        queries = [
            Message(RecordDict({rp.CONFIG_RECORD: ConfigRecord({rp.ASK: SITE_KEY})}), dst_node_id=nid,
                    message_type=MessageType.QUERY)
            for nid in unknown
        ]
        for reply in grid.send_and_receive(queries, timeout=120):
            if reply.has_error():
                log.warning("node %s did not say which site it is: %s", reply.metadata.src_node_id,
                            failure_text(reply.error.code))
                continue
            site = str(reply.content[rp.CONFIG_RECORD][SITE_KEY])
            if site not in self.factory.sites:
                log.warning("node %s claims unknown site %r; ignoring it", reply.metadata.src_node_id, site)
                continue
            self._bind(reply.metadata.src_node_id, site, node_ids)

    @staticmethod
    def _registered_names(grid: Grid) -> dict[int, str]:
        """Node id -> registered name, for nodes that have one (none in simulation)."""
        try:
            return {int(n.node_id): n.name for n in grid.get_nodes() if n.name}
        except (AttributeError, NotImplementedError):
            return {}

    def _bind(self, node_id: int, site: str, active: list[int]) -> None:
        """Map ``node_id`` to ``site`` unless another node active now already is that site."""
        holders = [nid for nid, s in self.node_to_site.items() if s == site and nid != node_id]
        if any(nid in active for nid in holders):
            log.warning("node %s claims site %r, which node %s already is; two nodes cannot be one site",
                        node_id, site, holders[0])
            return
        for nid in holders:  # a restarted node came back under a new id
            del self.node_to_site[nid]
        self.node_to_site[node_id] = site

    def _personalise(self, messages: Iterable[Message], arrays: ArrayRecord, grid: Grid) -> list[Message]:
        messages = list(messages)
        self._resolve_sites(grid, [m.metadata.dst_node_id for m in messages])
        weights = self._weights = FrozenWeights(arrays_to_numpy(arrays))  # hashed once for every site's package
        started, out = time.perf_counter(), []
        for message in messages:
            node = message.metadata.dst_node_id
            site = self.node_to_site.get(node)
            if site is None:
                continue  # logged in _resolve_sites; an unknown node gets nothing
            if site in self.factory.refused:  # its compile plan does not fit: the others go on
                log.warning("not pushing round %s to site %r: %s", message.content[rp.CONFIG_RECORD][rp.SERVER_ROUND], site,
                            self.factory.refused[site])
                stats = self._site_stats(int(message.content[rp.CONFIG_RECORD][rp.SERVER_ROUND]), site)
                stats["status"] = NOT_PUSHED_STATUS
                stats["train-error"] = f"not pushed: {self.factory.refused[site]}"
                continue
            package = self.factory.issue(site, weights)
            # FedAvg shares one RecordDict (and config) across messages: build a fresh one per site.
            config = ConfigRecord(dict(message.content[rp.CONFIG_RECORD]))
            config[SITE_KEY] = site
            config[PACKAGE_KEY] = package.data
            content = RecordDict({rp.ARRAYS_RECORD: self._site_arrays(site, weights, config), rp.CONFIG_RECORD: config})
            out.append(Message(content=content, dst_node_id=node, message_type=message.metadata.message_type))
            stats = self._site_stats(int(config[rp.SERVER_ROUND]), site)
            stats[rp.PACKAGE_BYTES], stats["precision"] = len(package.data), self.factory.precisions.get(site, "fp32")
        self._sent = [(m, self.node_to_site[m.metadata.dst_node_id]) for m in out]
        if messages:  # what the coordinator spent signing, sealing and packing this phase's packages
            phase = "train" if messages[0].metadata.message_type == MessageType.TRAIN else "eval"
            server_round = int(messages[0].content[rp.CONFIG_RECORD][rp.SERVER_ROUND])
            self.timings.setdefault(server_round, {})[f"{phase}-packages-seconds"] = time.perf_counter() - started
        return out

    def _site_arrays(self, site: str, weights: dict[str, np.ndarray], config: ConfigRecord) -> ArrayRecord:
        """The weights that travel beside the package. The signed package carries them already, so
        a plain round sends none (the download is the package alone) and names the weights the
        reply must carry. Central DP's clipping mod clips (reply - these), so under central DP they
        are the weights the site starts from: its package's, int8 or fp16 rounding included."""
        if CLIPPING_NORM_KEY not in config:
            config[REPLY_KEYS] = list(weights)
            return ArrayRecord()
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in self.factory.shipped(site, weights).items()})

    def reanchor(self, server_round: int, replies: list[Message]) -> list[Message]:
        """Move each reply of a site sent rounded weights (int8 or fp16 package) onto the exact ones:
        reply + (global - shipped). The site's update is what it trained; the rounding it started
        from is public and stays out of the model. Replies of fp32 sites are unchanged."""
        sent = {m.metadata.message_id: site for m, site in self._sent}
        for reply in replies:
            site = self._reply_site(reply, sent)
            if reply.has_error() or self.factory.precisions.get(site, "fp32") == "fp32" or self._weights is None:
                continue
            shipped = self.factory.shipped(site, self._weights)
            record = reply.content[rp.ARRAYS_RECORD]
            reply.content[rp.ARRAYS_RECORD] = ArrayRecord({
                k: Array(a.numpy() + (self._weights[k] - shipped[k]) if k in shipped else a.numpy())
                for k, a in record.items()})
        return replies

    def _reply_site(self, reply: Message, sent: dict[str, str]) -> str:
        """The site a reply answers: matched by the id of the message it replies to (a reply the
        SuperLink makes for a dead node carries another source node), else by its source node."""
        site = sent.get(reply.metadata.reply_to_message_id)
        return site or self.node_to_site.get(reply.metadata.src_node_id, f"node-{reply.metadata.src_node_id}")

    @property
    def weighted_by_key(self) -> str:
        """The reply metric the wrapped strategy weights by (Flower's DP wrapper reads it)."""
        return getattr(self.strategy, "weighted_by_key", rp.NUM_EXAMPLES)

    def summary(self) -> None:
        log.debug("per-site packages for %d sites around %s", len(getattr(self.factory, "sites", ())),
                  type(self.strategy).__name__)
        self.strategy.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        """The wrapped strategy's train messages (its config: ``server-round``, FedProx's
        ``proximal-mu``, ...), each carrying its site's package."""
        messages = self.strategy.configure_train(server_round, arrays, config, grid)
        return self._personalise(messages, arrays, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        messages = self.strategy.configure_evaluate(server_round, arrays, config, grid)
        return self._personalise(messages, arrays, grid)

    # -- replies ----------------------------------------------------------------
    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        """Record, drop exhausted sites, re-anchor, then the wrapped strategy's aggregate (its
        server optimiser state, e.g. FedAdam's moments, lives in that strategy)."""
        replies = list(replies)
        if not self.central_dp:  # under central DP the wrapper took them already
            replies = self.take_train_replies(server_round, replies)
        arrays, metrics = self.strategy.aggregate_train(self.round_offset + server_round, replies)
        return self._as_sent(arrays), metrics

    def _as_sent(self, arrays: ArrayRecord | None) -> ArrayRecord | None:
        """The aggregate in the dtypes of the weights sent: Flower's FedAdam/FedYogi compute in float64
        (np.float64 scalars), and a package's initializers must keep the model's float32."""
        if arrays is None or self._weights is None:
            return arrays
        return ArrayRecord({k: Array(np.asarray(a.numpy(), dtype=self._weights[k].dtype) if k in self._weights
                                     else a.numpy()) for k, a in arrays.items()})

    def take_train_replies(self, server_round: int, replies: Iterable[Message], *,
                           keep_exhausted: bool = False) -> list[Message]:
        """The train replies the wrapped strategy should aggregate: each site's metrics stored,
        exhausted sites dropped (or kept as zero updates, ``keep_exhausted``), rounded ones re-anchored."""
        return self.reanchor(server_round, self._record(server_round, replies, "train", keep_exhausted))

    def _site_stats(self, server_round: int, site: str) -> dict:
        return self.rounds.setdefault(server_round, {}).setdefault(site, {})

    def _record(self, server_round: int, replies: Iterable[Message], prefix: str,
                keep_exhausted: bool = False) -> list[Message]:
        """Store each site's metrics; return the replies that should be aggregated.

        A "budget exhausted" reply is dropped unless ``keep_exhausted`` (central DP:
        the reply then carries the unchanged weights, a zero update, so that the
        accountant's fixed sample size holds).
        """
        kept = []
        sent = {m.metadata.message_id: site for m, site in self._sent}  # ids are set when the grid sends them
        answered = set()
        for reply in replies:
            site = self._reply_site(reply, sent)
            answered.add(site)
            stats = self._site_stats(server_round, site)
            if reply.has_error():  # only the code is kept: a reason text is never read (DESIGN.md §3)
                shown = stats[f"{prefix}-error"] = failure_text(reply.error.code)
                stats["status"] = FAILED_STATUS
                log.warning("site %s failed in round %d (%s): %s", site, server_round, prefix, shown)
                reply.error = Error(code=reply.error.code, reason=shown)  # FedAvg logs it as a failure
                kept.append(reply)
                continue
            metrics = dict(reply.content[rp.METRICS_RECORD])
            stats.update({f"{prefix}-{k}" if k not in rp.LEDGER_TOTALS else k: v
                          for k, v in metrics.items()})
            if metrics.get(EXHAUSTED_METRIC):
                stats["status"] = EXHAUSTED_STATUS
                log.warning("site %s dropped out of round %d (%s): privacy budget exhausted; the round goes on "
                            "with the other sites", site, server_round, prefix)
                if keep_exhausted and prefix == "train":
                    kept.append(reply)
                continue
            stats.setdefault("status", "ok")
            kept.append(reply)
        for site in sorted({site for _, site in self._sent} - answered):
            stats = self._site_stats(server_round, site)
            stats[f"{prefix}-error"] = "no reply within the round timeout"
            stats["status"] = FAILED_STATUS
            log.warning("site %s did not reply in round %d (%s) within the round timeout", site, server_round, prefix)
        return kept

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Pool the sites' noisy (correct, total) counts into one accuracy with a 95 % interval
        (:mod:`.evaluation`); no per-site accuracy is averaged, and nothing shown leaves [0, 1]."""
        counts = []
        for reply in self._record(server_round, replies, "eval"):
            if reply.has_error():
                continue
            m = reply.content[rp.METRICS_RECORD]
            site = self.node_to_site.get(reply.metadata.src_node_id)
            c = SiteCounts(int(m[rp.NOISY_CORRECT]), int(m[rp.NOISY_TOTAL]), float(m[rp.COUNT_NOISE_SCALE]))
            counts.append(c)
            if site is not None:
                self._site_stats(server_round, site)["eval-accuracy"] = (
                    clip01(c.correct / c.total) if c.total > 0 else float("nan"))
        pooled = pool(counts)
        if pooled is None:
            return None
        self.evaluations[server_round] = pooled.to_dict()
        return MetricRecord({"accuracy": pooled.accuracy, "accuracy-low": pooled.low, "accuracy-high": pooled.high})


#: The name older code and tests use: SitePackages(factory, **fedavg_kwargs) wraps Flower's FedAvg.
SitePackageFedAvg = SitePackages


class CentralDpFixedClipping(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side fixed-clipping central DP around :class:`SitePackages`.

    Flower's own checks (an accountant needs a strategy whose ``aggregate_train`` is FedAvg's)
    run on the Flower strategy :class:`SitePackages` wraps, the one that computes the mean;
    the per-site layer in between only re-anchors replies by public constants.

    Records per-site statistics before Flower validates and noises the aggregate,
    and stores the accountant's cumulative (ε, δ) in ``strategy.central[r]``.
    Flower's accountant needs exactly ``num_sampled_clients`` replies with equal
    weights: agents report ``num-examples`` 1 under central DP, and an exhausted
    site answers with a zero update instead of being dropped. A round with an
    error reply, or fewer replies, is skipped (no aggregate, no ε spent).
    """

    strategy: SitePackages

    def __init__(self, strategy: SitePackages, noise_multiplier: float, clipping_norm: float,
                 num_sampled_clients: int, **kwargs) -> None:
        super().__init__(strategy.strategy, noise_multiplier, clipping_norm, num_sampled_clients, **kwargs)
        self.strategy = strategy
        strategy.central_dp = True

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = self.strategy.take_train_replies(server_round, replies, keep_exhausted=True)
        result = super().aggregate_train(server_round, replies)
        spent = self.privacy_spent()
        central = {"released": result[0] is not None, "noise_multiplier": self.noise_multiplier,
                   "clipping_norm": self.clipping_norm}
        if spent is not None:
            central.update(epsilon=float(spent.epsilon), delta=float(spent.delta),
                           releases=int(spent.num_releases))
        self.strategy.central[server_round] = central
        return result
