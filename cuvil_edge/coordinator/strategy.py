"""The per-site layer around whichever Flower strategy the federation chose.

:class:`SitePackages` wraps a Flower strategy (FedAvg, FedProx, FedAdam, FedYogi or FedAvgM,
see :func:`flower_strategy`) by composition, as Flower's DP wrappers do. The wrapped strategy
samples nodes, builds the round's config and aggregates; the layer adds three small parts and
only delegates to them: a :class:`~.site_directory.SiteDirectory` (which site each node is), a
:class:`~.personaliser.Personaliser` (each site's own package into its message; rounded replies
re-anchored) and a :class:`~.round_recorder.RoundRecorder` (typed per-site results; sites that
reply "budget exhausted" left out of the average instead of failing the round; the checkpoint and
report row of each completed round).

With central DP, :class:`CentralDpFixedClipping` (Flower's
``DifferentialPrivacyClientSideFixedClipping``) wraps this layer; Flower's accountant checks
the strategy inside, whose ``aggregate_train`` must be FedAvg's (fedavg or fedprox).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import (
    DifferentialPrivacyClientSideFixedClipping,
    FedAdam,
    FedAvg,
    FedAvgM,
    FedProx,
    FedYogi,
    Strategy,
)

from cuvil_edge.config import round_protocol as rp
from cuvil_edge.coordinator.packaging import PackageFactory
from cuvil_edge.coordinator.personaliser import EVAL, TRAIN, Personaliser, arrays_to_numpy  # noqa: F401 (re-exported)
from cuvil_edge.coordinator.round_recorder import RoundRecorder
from cuvil_edge.coordinator.site_directory import SiteDirectory

log = logging.getLogger(__name__)

#: The federation YAML's ``strategy.name`` -> Flower's strategy class (never a copy of one).
FLOWER_STRATEGIES: dict[str, type[FedAvg]] = {
    "fedavg": FedAvg,
    "fedprox": FedProx,
    "fedadam": FedAdam,
    "fedyogi": FedYogi,
    "fedavgm": FedAvgM,
}


def flower_strategy(name: str, parameters: dict, **sampling) -> FedAvg:
    """Flower's strategy ``name`` with its own ``parameters`` (validated by the federation schema)
    and the sampling settings (``fraction_train``, ``min_train_nodes``, ...)."""
    return FLOWER_STRATEGIES[name](**sampling, **parameters)


class SitePackages(Strategy):
    """A Flower strategy whose messages each carry the receiving site's own signed package.

    ``strategy`` samples and aggregates (default: ``FedAvg`` built from ``fedavg_kwargs``); train
    replies are taken (:meth:`take_train_replies`) before it aggregates them (:meth:`aggregate_taken`).
    """

    def __init__(self, factory: PackageFactory, strategy: Strategy | None = None, **fedavg_kwargs) -> None:
        if strategy is not None and fedavg_kwargs:
            raise TypeError("give a Flower strategy or FedAvg's keyword arguments, not both")
        self.strategy = strategy if strategy is not None else FedAvg(**fedavg_kwargs)
        self.factory = factory
        self.directory = SiteDirectory(factory.sites if factory is not None else {})
        self.personaliser = Personaliser(factory, self.directory)
        self.recorder = RoundRecorder()

    @property
    def round_offset(self) -> int:
        """Rounds completed before this run (a resumed one): the wrapped strategy's aggregation counts
        on from there (FedAdam's bias correction depends on the round number), as do the recorder's
        checkpoints and report rows."""
        return self.recorder.round_offset

    @round_offset.setter
    def round_offset(self, value: int) -> None:
        self.recorder.round_offset = value

    @property
    def weighted_by_key(self) -> str:
        """The reply metric the wrapped strategy weights by (Flower's DP wrapper reads it)."""
        return getattr(self.strategy, "weighted_by_key", rp.NUM_EXAMPLES)

    def summary(self) -> None:
        log.debug(
            "per-site packages for %d sites around %s",
            len(getattr(self.factory, "sites", ())),
            type(self.strategy).__name__,
        )
        self.strategy.summary()

    # -- messages ---------------------------------------------------------------
    def personalise(self, messages: Iterable[Message], arrays: ArrayRecord, grid: Grid | None) -> list[Message]:
        """``messages`` (the wrapped strategy's, one per sampled node) as per-site ones, each site's
        package and what it was sent (or why not) recorded."""
        messages = list(messages)
        self.directory.resolve(grid, [m.metadata.dst_node_id for m in messages])
        sent = self.personaliser.personalise(messages, arrays)
        self.recorder.record_sent(sent)
        return sent.messages

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        """The wrapped strategy's train messages (its config: ``server-round``, FedProx's
        ``proximal-mu``, ...), each carrying its site's package."""
        return self.personalise(self.strategy.configure_train(server_round, arrays, config, grid), arrays, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self.personalise(self.strategy.configure_evaluate(server_round, arrays, config, grid), arrays, grid)

    # -- replies ----------------------------------------------------------------
    def _recorded(
        self, server_round: int, phase: str, replies: Iterable[Message], keep_exhausted: bool = False
    ) -> list[tuple[str, Message]]:
        credited = [(self.personaliser.site_of(r), r) for r in replies]
        return self.recorder.record_replies(
            server_round, phase, credited, self.personaliser.sent_sites(), keep_exhausted
        )

    def take_train_replies(
        self, server_round: int, replies: Iterable[Message], *, keep_exhausted: bool = False
    ) -> list[Message]:
        """The train replies the wrapped strategy should aggregate: each site's results recorded,
        exhausted sites dropped (or kept as zero updates, ``keep_exhausted``), rounded ones re-anchored."""
        kept = self._recorded(server_round, TRAIN, replies, keep_exhausted)
        return self.personaliser.reanchor([reply for _, reply in kept])

    def aggregate_taken(self, server_round: int, replies: Iterable[Message]):
        """The wrapped strategy's aggregate of replies :meth:`take_train_replies` returned (its server
        optimiser state, e.g. FedAdam's moments, lives in that strategy), in the dtypes sent."""
        arrays, metrics = self.strategy.aggregate_train(self.round_offset + server_round, list(replies))
        return self.personaliser.as_sent(arrays), metrics

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        """Record, drop exhausted sites, re-anchor, then the wrapped strategy's aggregate."""
        return self.aggregate_taken(server_round, self.take_train_replies(server_round, replies))

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The sites' noisy counts pooled into one accuracy with a 95 % interval (the recorder's)."""
        pooled = self.recorder.pool_evaluation(server_round, self._recorded(server_round, EVAL, replies))
        if pooled is None:
            return None
        return MetricRecord({"accuracy": pooled.accuracy, "accuracy-low": pooled.low, "accuracy-high": pooled.high})

    def replies_taken(self) -> RepliesTaken:
        """This layer as seen by a wrapper that took the train replies itself (:class:`RepliesTaken`)."""
        return RepliesTaken(self)


class RepliesTaken(Strategy):
    """:class:`SitePackages` whose ``aggregate_train`` aggregates replies already taken.

    Flower's DP wrapper calls its inner strategy's ``aggregate_train`` after validating the
    replies; :class:`CentralDpFixedClipping` must record them *before* that validation (an
    exhausted site's zero update, a failure's code), so it takes them itself and hands Flower this
    view, which aggregates without recording a second time. Everything else is the layer's own.
    """

    def __init__(self, sites: SitePackages) -> None:
        self.sites = sites

    @property
    def weighted_by_key(self) -> str:  # what Flower's equal-weights check reads
        return self.sites.weighted_by_key

    def summary(self) -> None:
        self.sites.summary()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self.sites.configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self.sites.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        return self.sites.aggregate_taken(server_round, replies)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return self.sites.aggregate_evaluate(server_round, replies)


SitePackageFedAvg = SitePackages  # the older name: SitePackages(factory, **fedavg_kwargs) wraps FedAvg


class CentralDpFixedClipping(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side fixed-clipping central DP around :class:`SitePackages`.

    Flower's own checks (an accountant needs a strategy whose ``aggregate_train`` is FedAvg's)
    run on the Flower strategy :class:`SitePackages` wraps, the one that computes the mean;
    the per-site layer in between only re-anchors replies by public constants.

    Records per-site results before Flower validates and noises the aggregate (so Flower's
    inner strategy is :meth:`SitePackages.replies_taken`, which does not record them again), and
    stores the accountant's cumulative (ε, δ) in the layer's recorder. Flower's accountant needs
    exactly ``num_sampled_clients`` replies with equal weights: agents report ``num-examples`` 1
    under central DP, and an exhausted site answers with a zero update instead of being dropped.
    A round with an error reply, or fewer replies, is skipped (no aggregate, no ε spent).
    """

    def __init__(
        self, strategy: SitePackages, noise_multiplier: float, clipping_norm: float, num_sampled_clients: int, **kwargs
    ) -> None:
        super().__init__(strategy.strategy, noise_multiplier, clipping_norm, num_sampled_clients, **kwargs)
        self.sites = strategy
        self.strategy = strategy.replies_taken()

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        replies = self.sites.take_train_replies(server_round, replies, keep_exhausted=True)
        result = super().aggregate_train(server_round, replies)
        self.sites.recorder.record_central(
            server_round, result[0] is not None, self.noise_multiplier, self.clipping_norm, self.privacy_spent()
        )
        return result
