"""Which enrolled site each Flower node is: the coordinator's only source of node -> site.

A package is signed for one site, so sending it to the wrong node would hand one site's model
(and, sealed, its key material) to another. A node's site therefore comes from the strongest
evidence there is: on the deployment engine with node authentication, the name the node was
registered under (`coordinator serve` registers each enrolled site's key under its name), never
what the node says; only in simulation, where nodes have no registered names, is it asked with a
QUERY message. Two nodes active at once can never be one site; a node that restarted under a new
id takes its site over from the old id.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from cuvil_edge.config import round_protocol as rp
from cuvil_edge.config.round_protocol import failure_text

log = logging.getLogger(__name__)

#: Seconds the simulation's nodes get to say which site they are.
QUERY_TIMEOUT = 120


class SiteDirectory:
    """Node id <-> enrolled site name, learnt once per node and kept for the run."""

    def __init__(self, enrolled: Collection[str]) -> None:
        self.enrolled = enrolled
        self._sites: dict[int, str] = {}

    def site_of(self, node_id: int) -> str | None:
        """The site ``node_id`` is, or None for a node that is no enrolled site (it gets nothing)."""
        return self._sites.get(node_id)

    def bindings(self) -> dict[int, str]:
        """A copy of node id -> site (what the run knows so far)."""
        return dict(self._sites)

    def resolve(self, grid: Grid | None, node_ids: Iterable[int]) -> None:
        """Learn the site of each of ``node_ids`` not known yet: by its registered name where the
        grid has names (deployment engine), else by a QUERY (simulation). Nodes already known cost
        nothing, so a phase whose nodes are all known never touches the grid."""
        node_ids = list(node_ids)
        unknown = [nid for nid in node_ids if nid not in self._sites]
        if not unknown:
            return
        names = registered_names(grid)
        if names:
            for nid in unknown:
                site = names.get(nid, "")
                if site in self.enrolled:
                    self.bind(nid, site, node_ids)
                else:
                    log.warning("node %s is registered as %r, not an enrolled site; it gets nothing", nid, site)
            return
        queries = [
            Message(
                RecordDict({rp.CONFIG_RECORD: ConfigRecord({rp.ASK: rp.SITE})}),
                dst_node_id=nid,
                message_type=MessageType.QUERY,
            )
            for nid in unknown
        ]
        # a caller without a grid (None) has every node known already
        for reply in grid.send_and_receive(queries, timeout=QUERY_TIMEOUT):  # type: ignore[union-attr]
            node = reply.metadata.src_node_id
            if reply.has_error():
                log.warning("node %s did not say which site it is: %s", node, failure_text(reply.error.code))
                continue
            site = str(reply.content[rp.CONFIG_RECORD][rp.SITE])
            if site not in self.enrolled:
                log.warning("node %s claims unknown site %r; ignoring it", node, site)
                continue
            self.bind(node, site, node_ids)

    def bind(self, node_id: int, site: str, active: Iterable[int] = ()) -> bool:
        """Map ``node_id`` to ``site`` unless a node in ``active`` (the nodes of this phase) already
        is that site; an inactive holder is a restarted node's old id and loses the site. Returns
        whether ``node_id`` is now ``site``."""
        active = set(active)
        holders = [nid for nid, s in self._sites.items() if s == site and nid != node_id]
        if any(nid in active for nid in holders):
            log.warning(
                "node %s claims site %r, which node %s already is; two nodes cannot be one site",
                node_id,
                site,
                holders[0],
            )
            return False
        for nid in holders:
            del self._sites[nid]
        self._sites[node_id] = site
        return True


def registered_names(grid: Grid | None) -> dict[int, str]:
    """Node id -> registered name, for nodes that have one (none in simulation)."""
    try:
        return {int(n.node_id): n.name for n in grid.get_nodes() if n.name}  # type: ignore[union-attr]  # None: caught
    except (AttributeError, NotImplementedError):
        return {}
