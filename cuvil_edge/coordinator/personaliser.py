"""Each site's own signed package into the message the wrapped Flower strategy built for it.

A Flower strategy builds one message per sampled node, all sharing one content. Every site must
instead get a package signed (and possibly sealed) for it alone, at its planned precision, so the
personaliser rebuilds each message around that site's package. It also remembers which message
went to which site, because a reply is credited by the id of the message it answers (a reply the
SuperLink makes for a dead node carries another source node), and it undoes what the rounding of
an fp16/int8 package did to a reply before the strategy averages it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from cuvil_edge.config import round_protocol as rp
from cuvil_edge.coordinator.packaging import FrozenWeights, PackageFactory
from cuvil_edge.coordinator.site_directory import SiteDirectory

log = logging.getLogger(__name__)

#: The phase names per-site results and timings are keyed by (metrics.json's ``train-*``, ``eval-*``).
TRAIN, EVAL = "train", "eval"


def arrays_to_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in arrays.items()}


@dataclass(frozen=True)
class Issued:
    """One site's package of a phase: what the round table shows about it."""

    package_bytes: int
    precision: str


@dataclass
class Personalised:
    """One phase's messages as sent, and what happened to each site on the way."""

    server_round: int | None  # None: the strategy sampled nobody this phase
    phase: str
    messages: list[Message] = field(default_factory=list)
    issued: dict[str, Issued] = field(default_factory=dict)  # site -> its package
    refused: dict[str, str] = field(default_factory=dict)  # site -> why its plan sends it nothing
    seconds: float = 0.0  # signing, sealing and packing this phase's packages


class Personaliser:
    """Turns the wrapped strategy's messages into per-site ones and maps replies back to sites."""

    def __init__(self, factory: PackageFactory, directory: SiteDirectory) -> None:
        self.factory, self.directory = factory, directory
        self._sent: list[tuple[Message, str]] = []  # this phase's messages and their sites
        self._weights: FrozenWeights | None = None  # the global weights this phase sent
        self._by_id: dict[str, str] = {}  # message id -> site, of this phase's sent messages

    def personalise(self, messages: Iterable[Message], arrays: ArrayRecord) -> Personalised:
        """A message per known, planned site, carrying its package; unknown nodes get nothing
        (the directory logged why) and a site whose plan does not fit is left out, the others go on."""
        messages = list(messages)
        self._by_id = {}
        if not messages:
            self._sent = []
            return Personalised(None, TRAIN)
        config0 = messages[0].content[rp.CONFIG_RECORD]
        done = Personalised(
            int(config0[rp.SERVER_ROUND]),  # type: ignore[arg-type]  # the round number in a ConfigRecord
            TRAIN if messages[0].metadata.message_type == MessageType.TRAIN else EVAL,
        )
        weights = self._weights = FrozenWeights(arrays_to_numpy(arrays))  # hashed once for every site's package
        started, sent = time.perf_counter(), []
        for message in messages:
            node = message.metadata.dst_node_id
            site = self.directory.site_of(node)
            if site is None:
                continue
            if site in self.factory.refused:
                log.warning("not pushing round %s to site %r: %s", done.server_round, site, self.factory.refused[site])
                done.refused[site] = self.factory.refused[site]
                continue
            package = self.factory.issue(site, weights)
            # FedAvg shares one RecordDict (and config) across messages: build a fresh one per site.
            config = ConfigRecord(dict(message.content[rp.CONFIG_RECORD]))  # type: ignore[arg-type]  # a ConfigRecord
            config[rp.SITE] = site
            config[rp.PACKAGE] = package.data
            content = RecordDict({rp.ARRAYS_RECORD: self._site_arrays(site, weights, config), rp.CONFIG_RECORD: config})
            out = Message(content=content, dst_node_id=node, message_type=message.metadata.message_type)
            sent.append((out, site))
            done.issued[site] = Issued(len(package.data), self.precision(site))
        self._sent = sent
        done.messages = [m for m, _ in sent]
        done.seconds = time.perf_counter() - started
        return done

    def precision(self, site: str) -> str:
        return self.factory.precisions.get(site, "fp32")

    def _site_arrays(self, site: str, weights: Mapping[str, np.ndarray], config: ConfigRecord) -> ArrayRecord:
        """The weights that travel beside the package. The signed package carries them already, so
        a plain round sends none (the download is the package alone) and names the weights the
        reply must carry. Central DP's clipping mod clips (reply - these), so under central DP they
        are the weights the site starts from: its package's, int8 or fp16 rounding included."""
        if rp.CLIPPING_NORM not in config:
            config[rp.REPLY_KEYS] = list(weights)
            return ArrayRecord()
        return ArrayRecord({k: Array(np.asarray(v)) for k, v in self.factory.shipped(site, weights).items()})

    def sent_sites(self) -> set[str]:
        """The sites this phase sent a message to (those that owe a reply)."""
        return {site for _, site in self._sent}

    def site_of(self, reply: Message) -> str:
        """The site a reply answers: matched by the id of the message it replies to (ids are set
        when the grid sends them), else by its source node, else a name for the unknown node."""
        answered = reply.metadata.reply_to_message_id
        if answered not in self._by_id:  # the ids came after personalise: map them once per phase
            self._by_id = {m.metadata.message_id: site for m, site in self._sent}
        node = reply.metadata.src_node_id
        return self._by_id.get(answered) or self.directory.site_of(node) or f"node-{node}"

    def reanchor(self, replies: list[Message]) -> list[Message]:
        """Move each reply of a site sent rounded weights (int8 or fp16 package) onto the exact ones:
        reply + (global - shipped). The site's update is what it trained; the rounding it started
        from is public and stays out of the model. Replies of fp32 sites are unchanged."""
        for reply in replies:
            site = self.site_of(reply)
            if reply.has_error() or self.precision(site) == "fp32" or self._weights is None:
                continue
            shipped = self.factory.shipped(site, self._weights)
            record = reply.content[rp.ARRAYS_RECORD]
            reply.content[rp.ARRAYS_RECORD] = ArrayRecord(
                {
                    k: Array(a.numpy() + (self._weights[k] - shipped[k]) if k in shipped else a.numpy())  # type: ignore[union-attr]  # an ArrayRecord's Arrays
                    for k, a in record.items()
                }
            )
        return replies

    def as_sent(self, arrays: ArrayRecord | None) -> ArrayRecord | None:
        """The aggregate in the dtypes of the weights sent: Flower's FedAdam/FedYogi compute in float64
        (np.float64 scalars), and a package's initializers must keep the model's float32."""
        if arrays is None or self._weights is None:
            return arrays
        return ArrayRecord(
            {
                k: Array(np.asarray(a.numpy(), dtype=self._weights[k].dtype) if k in self._weights else a.numpy())
                for k, a in arrays.items()
            }
        )
