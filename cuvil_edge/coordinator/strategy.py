"""FedAvg that sends every site its own signed package.

Flower's FedAvg samples nodes, averages replies and drives the rounds; this
subclass only (1) learns which site each node is with a QUERY message,
(2) swaps the shared message content for a per-site one carrying that site's
package, and (3) keeps per-site round statistics, dropping sites that reply
"budget exhausted" from the average instead of failing the round.
"""

from __future__ import annotations

import logging
from typing import Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

from cuvil_edge.coordinator.packaging import PackageFactory

log = logging.getLogger(__name__)

#: Keys of the per-site ConfigRecord the agent reads (see agent/client_app.py).
PACKAGE_KEY = "package"
SITE_KEY = "site"
EXHAUSTED_METRIC = "budget-exhausted"


def arrays_to_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in arrays.items()}


class SitePackageFedAvg(FedAvg):
    """FedAvg whose messages each carry the receiving site's own signed package."""

    def __init__(self, factory: PackageFactory, **fedavg_kwargs) -> None:
        super().__init__(**fedavg_kwargs)
        self.factory = factory
        self.node_to_site: dict[int, str] = {}
        self.rounds: dict[int, dict] = {}

    # -- node -> site ---------------------------------------------------------
    def _resolve_sites(self, grid: Grid, node_ids: Iterable[int]) -> None:
        unknown = [nid for nid in node_ids if nid not in self.node_to_site]
        if not unknown:
            return
        queries = [
            Message(RecordDict({"config": ConfigRecord({"ask": SITE_KEY})}), dst_node_id=nid,
                    message_type=MessageType.QUERY)
            for nid in unknown
        ]
        for reply in grid.send_and_receive(queries, timeout=120):
            if reply.has_error():
                log.warning("node %s did not say which site it is: %s", reply.metadata.src_node_id, reply.error.reason)
                continue
            site = str(reply.content["config"][SITE_KEY])
            if site not in self.factory.sites:
                log.warning("node %s claims unknown site %r; ignoring it", reply.metadata.src_node_id, site)
                continue
            self.node_to_site[reply.metadata.src_node_id] = site

    def _personalise(self, messages: Iterable[Message], arrays: ArrayRecord, grid: Grid) -> list[Message]:
        messages = list(messages)
        self._resolve_sites(grid, [m.metadata.dst_node_id for m in messages])
        weights = arrays_to_numpy(arrays)
        out = []
        for message in messages:
            node = message.metadata.dst_node_id
            site = self.node_to_site.get(node)
            if site is None:
                continue  # logged in _resolve_sites; an unknown node gets nothing
            package = self.factory.issue(site, weights)
            # FedAvg shares one RecordDict (and config) across messages: build a fresh one per site.
            config = ConfigRecord(dict(message.content["config"]))
            config[SITE_KEY] = site
            config[PACKAGE_KEY] = package.data
            content = RecordDict({"arrays": arrays, "config": config})
            out.append(Message(content=content, dst_node_id=node, message_type=message.metadata.message_type))
            self._site_stats(int(config["server-round"]), site)["package-bytes"] = len(package.data)
        return out

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self._personalise(super().configure_train(server_round, arrays, config, grid), arrays, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        return self._personalise(super().configure_evaluate(server_round, arrays, config, grid), arrays, grid)

    # -- replies ----------------------------------------------------------------
    def _site_stats(self, server_round: int, site: str) -> dict:
        return self.rounds.setdefault(server_round, {}).setdefault(site, {})

    def _record(self, server_round: int, replies: Iterable[Message], prefix: str) -> list[Message]:
        """Store each site's metrics; return the replies that should be aggregated."""
        kept = []
        for reply in replies:
            site = self.node_to_site.get(reply.metadata.src_node_id, f"node-{reply.metadata.src_node_id}")
            stats = self._site_stats(server_round, site)
            if reply.has_error():
                stats[f"{prefix}-error"] = reply.error.reason
                kept.append(reply)  # FedAvg logs it as a failure
                continue
            metrics = dict(reply.content["metrics"])
            stats.update({f"{prefix}-{k}" if k not in ("eps-spent", "eps-remaining") else k: v
                          for k, v in metrics.items()})
            if metrics.get(EXHAUSTED_METRIC):
                stats["status"] = "budget exhausted"
                log.warning("site %s dropped out of round %d: privacy budget exhausted", site, server_round)
                continue
            stats.setdefault("status", "ok")
            kept.append(reply)
        return kept

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        return super().aggregate_train(server_round, self._record(server_round, replies, "train"))

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        return super().aggregate_evaluate(server_round, self._record(server_round, replies, "eval"))
