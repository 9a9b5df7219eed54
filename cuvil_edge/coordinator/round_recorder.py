"""What happened to each site in each round, typed, and the round's durable record when it is done.

Aggregation only needs the replies it may average; the operator needs to know, per site, why the
others were left out (failed, out of budget, not pushed, silent), what it was sent and what it
spent. The recorder keeps that as one :class:`SiteRound` per (round, site), whose ``to_dict`` is
the site's entry in metrics.json (report.py, status.py and the end-to-end tests read it), beside
the round's central-DP accounting, pooled evaluation and coordinator timings. When the global
model of a round is evaluated, :meth:`RoundRecorder.round_done` writes its checkpoint first and
then the report row, so a report never names a round a resumed run could not start from.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Error, Message

from cuvil_edge.config import round_protocol as rp
from cuvil_edge.config.round_protocol import failure_text
from cuvil_edge.coordinator.checkpoints import save_checkpoint
from cuvil_edge.coordinator.evaluation import PooledAccuracy, SiteCounts, clip01, pool
from cuvil_edge.coordinator.personaliser import TRAIN, Personalised
from cuvil_edge.coordinator.report import EXHAUSTED_STATUS, FAILED_STATUS, NOT_PUSHED_STATUS, RunReport
from cuvil_edge.coordinator.server_optimiser import optimiser_state

log = logging.getLogger(__name__)

OK_STATUS = "ok"
NO_REPLY = "no reply within the round timeout"


@dataclass
class SiteRound:
    """One site in one round, filled in as the round's phases go (send, train reply, eval reply)."""

    status: str | None = None  # None: nothing happened to the site yet
    errors: dict[str, str] = field(default_factory=dict)  # phase -> failure text (a code, never a reason)
    precision: str | None = None
    package_bytes: int | None = None
    metrics: dict[str, dict[str, Any]] = field(default_factory=dict)  # phase -> the reply's metrics
    eps_spent: float | None = None  # the site ledger's totals, as its latest reply reported them
    eps_left: float | None = None
    eval_accuracy: float | None = None  # noisy correct / noisy total, clipped to [0, 1]

    def to_dict(self) -> dict:
        """The site's metrics.json entry (without ``target``, which the report adds)."""
        out: dict[str, Any] = {} if self.status is None else {"status": self.status}
        if self.package_bytes is not None:
            out[rp.PACKAGE_BYTES], out["precision"] = self.package_bytes, self.precision
        for phase, metrics in self.metrics.items():
            out.update({f"{phase}-{k}": v for k, v in metrics.items()})
        out.update({f"{phase}-error": text for phase, text in self.errors.items()})
        if self.eps_spent is not None:
            out[rp.EPS_SPENT] = self.eps_spent
        if self.eps_left is not None:
            out[rp.EPS_REMAINING] = self.eps_left
        if self.eval_accuracy is not None:
            out["eval-accuracy"] = self.eval_accuracy
        return out

    def fail(self, phase: str, text: str, status: str = FAILED_STATUS) -> None:
        self.errors[phase], self.status = text, status


@dataclass(frozen=True)
class Checkpointing:
    """Where and with what a round's checkpoint is written: weights, Flower's central-DP accountant
    (its releases so far, so a resumed run never forgets ε) and the server optimiser's state."""

    home: Path
    federation: str
    planned_rounds: int
    accountant: Any = None  # Flower's RdpAccountant under central DP
    optimiser: Any = None  # the Flower strategy whose server optimiser state is kept
    trainable: Mapping[str, np.ndarray] | None = None

    def save(self, federation_round: int, weights: Mapping[str, np.ndarray]) -> None:
        save_checkpoint(
            self.home,
            self.federation,
            federation_round,
            weights,
            accountant=None if self.accountant is None else self.accountant.state_dict(),
            # trainable is set with the optimiser (server_app)
            optimiser=None if self.optimiser is None else optimiser_state(self.optimiser, self.trainable),  # type: ignore[arg-type]
            planned_rounds=self.planned_rounds,
        )


class RoundRecorder:
    """Per-site results by round; the checkpoint and report row of each completed round."""

    def __init__(self, report: RunReport | None = None, checkpoints: Checkpointing | None = None) -> None:
        self.report, self.checkpoints = report, checkpoints
        self.rounds: dict[int, dict[str, SiteRound]] = {}
        self.central: dict[int, dict] = {}  # round -> central-DP accounting
        self.evaluations: dict[int, dict] = {}  # round -> pooled federated accuracy
        self.timings: dict[int, dict] = {}  # round -> seconds the coordinator spent per phase
        #: Rounds completed before this run (a resumed one): reports and checkpoints number on from there.
        self.round_offset = 0

    def site(self, server_round: int, site: str) -> SiteRound:
        return self.rounds.setdefault(server_round, {}).setdefault(site, SiteRound())

    def sites(self, server_round: int) -> dict[str, dict]:
        """Site -> its metrics.json entry for ``server_round`` (sites nothing happened to are absent)."""
        return {site: s.to_dict() for site, s in self.rounds.get(server_round, {}).items()}

    def record_sent(self, sent: Personalised) -> None:
        """What each site was sent this phase (package size, precision) or why it was sent nothing."""
        if sent.server_round is None:
            return
        for site, why in sent.refused.items():
            self.site(sent.server_round, site).fail(TRAIN, f"not pushed: {why}", NOT_PUSHED_STATUS)
        for site, issued in sent.issued.items():
            s = self.site(sent.server_round, site)
            s.package_bytes, s.precision = issued.package_bytes, issued.precision
        self.timings.setdefault(sent.server_round, {})[f"{sent.phase}-packages-seconds"] = sent.seconds

    def record_replies(
        self,
        server_round: int,
        phase: str,
        replies: Iterable[tuple[str, Message]],
        asked: set[str],
        keep_exhausted: bool = False,
    ) -> list[tuple[str, Message]]:
        """Store each (site, reply); return those the phase should aggregate, and name each site of
        ``asked`` that did not reply. A failure is kept (Flower's strategies count it) with only its
        code as reason; a "budget exhausted" reply is dropped unless ``keep_exhausted`` (central DP:
        it then carries the unchanged weights, a zero update, so the accountant's sample size holds)."""
        kept, answered = [], set()
        for site, reply in replies:
            answered.add(site)
            s = self.site(server_round, site)
            if reply.has_error():  # only the code is kept: a reason text is never read
                shown = failure_text(reply.error.code)
                s.fail(phase, shown)
                log.warning("site %s failed in round %d (%s): %s", site, server_round, phase, shown)
                reply.error = Error(code=reply.error.code, reason=shown)  # what Flower logs of it
                kept.append((site, reply))
                continue
            metrics: dict[str, Any] = dict(reply.content[rp.METRICS_RECORD])
            s.eps_spent = metrics.pop(rp.EPS_SPENT, s.eps_spent)
            s.eps_left = metrics.pop(rp.EPS_REMAINING, s.eps_left)
            s.metrics.setdefault(phase, {}).update(metrics)
            if metrics.get(rp.BUDGET_EXHAUSTED):
                s.status = EXHAUSTED_STATUS
                log.warning(
                    "site %s dropped out of round %d (%s): privacy budget exhausted; the round goes on "
                    "with the other sites",
                    site,
                    server_round,
                    phase,
                )
                if keep_exhausted and phase == TRAIN:
                    kept.append((site, reply))
                continue
            s.status = s.status or OK_STATUS
            kept.append((site, reply))
        for site in sorted(asked - answered):
            self.site(server_round, site).fail(phase, NO_REPLY)
            log.warning("site %s did not reply in round %d (%s) within the round timeout", site, server_round, phase)
        return kept

    def pool_evaluation(self, server_round: int, replies: Iterable[tuple[str, Message]]) -> PooledAccuracy | None:
        """Pool the sites' noisy (correct, total) counts into one accuracy with a 95 % interval
        (:mod:`.evaluation`): no per-site accuracy is averaged, and nothing shown leaves [0, 1]."""
        counts = []
        for site, reply in replies:
            if reply.has_error():
                continue
            m: Any = reply.content[rp.METRICS_RECORD]  # a MetricRecord of numbers
            c = SiteCounts(int(m[rp.NOISY_CORRECT]), int(m[rp.NOISY_TOTAL]), float(m[rp.COUNT_NOISE_SCALE]))
            counts.append(c)
            self.site(server_round, site).eval_accuracy = clip01(c.correct / c.total) if c.total > 0 else float("nan")
        pooled = pool(counts)
        if pooled is not None:
            self.evaluations[server_round] = pooled.to_dict()
        return pooled

    def record_central(
        self, server_round: int, released: bool, noise_multiplier: float, clipping_norm: float, spent: Any = None
    ) -> dict:
        """Central DP's round: whether an aggregate was released and Flower's cumulative (ε, δ)."""
        central = {"released": released, "noise_multiplier": noise_multiplier, "clipping_norm": clipping_norm}
        if spent is not None:
            central.update(epsilon=float(spent.epsilon), delta=float(spent.delta), releases=int(spent.num_releases))
        self.central[server_round] = central
        return central

    def round_done(self, server_round: int, accuracy: float, weights: Mapping[str, np.ndarray]) -> dict | None:
        """The global model of ``server_round`` was evaluated: its checkpoint (durable before the
        report says the round is done), then its report row. Round 0 is the model before this run's
        first round (a resumed run's: the checkpoint's), numbered as the round it comes from; no
        site was asked anything yet, so it is never checkpointed again."""
        federation_round = self.round_offset + server_round
        if server_round > 0 and self.checkpoints is not None:
            self.checkpoints.save(federation_round, weights)
        if self.report is None:
            return None
        return self.report.add_round(
            federation_round,
            accuracy,
            self.sites(server_round),
            central=self.central.get(server_round),
            federated=self.evaluations.get(server_round),
            timings=self.timings.get(server_round),
            initial=server_round == 0,
        )
