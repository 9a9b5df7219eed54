"""Durable per-site privacy-budget ledger (write-ahead, fail closed).

One SQLite database per site, in WAL mode with ``synchronous=FULL`` so every
commit is fsynced. A spend goes through two steps:

1. ``reserve(event, key=...)``: ``BEGIN IMMEDIATE`` (one writer at a time,
   across processes), refuse with :class:`ReplayError` if the idempotency key
   was ever claimed before, recompute the total over every non-aborted row
   plus the new event, refuse with :class:`BudgetExhaustedError` if it would
   exceed the budget, else insert a ``reserved`` row (mechanism, parameters,
   standalone (ε, δ), round, key, UTC time, config hash) and ``COMMIT``. The
   claim is exclusive: exactly one caller per key ever gets a reservation, and
   only then may it compute anything from the data.
2. ``commit``: mark the row ``committed`` once the value has been released,
   or ``abort`` it when it is certain nothing left the process.

A row left ``reserved`` by a crash still counts (fail closed), and its key
stays claimed: a replayed or duplicated message never computes or releases
again. A file that is unreadable, truncated or not a ledger raises
:class:`LedgerError`; the ledger is never silently reset.

The budget is recorded in the ledger when it is created; raising it takes
:meth:`PrivacyLedger.record_budget` (``cuvil-edge privacy raise-budget``),
which records the change and its reason. A larger budget in the site YAML
alone is refused; a smaller one is enforced as given.

Accounting (:mod:`cuvil_edge.privacy.accounting`): DP-SGD events are stored
as ``(noise_multiplier, sample_rate, steps)``, Gaussian releases as
``(noise_std, sensitivity)``, Laplace and other pure releases as their ε; the total is
min(all events composed by the pessimistic PLD accountant, basic composition) at the ledger's δ
(RDP is the cross-check). Each row also keeps its standalone ε by the same accountant.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from cuvil_edge.errors import BudgetExhaustedError, LedgerError, PrivacyError, ReplayError
from cuvil_edge.privacy._checks import positive_finite
from cuvil_edge.privacy._ledger_db import _COLUMNS, PARAMETER_COLUMNS, SCHEMA_VERSION, _LedgerFile, _Transaction
from cuvil_edge.privacy.accounting import (
    Accountant,
    DpSgd,
    Event,
    cumulative_epsilons,
    event_from,
    event_parameters,
    is_event,
    is_pure,
)

__all__ = ["LEDGER_FILENAME", "SCHEMA_VERSION", "PrivacyLedger", "Reservation", "budget_config_hash", "dpsgd_epsilon"]

logger = logging.getLogger(__name__)

LEDGER_FILENAME = "ledger.sqlite"  # the file's name inside an agent's state directory
_MAX_KEY_LEN = 200


@dataclass(frozen=True)
class Reservation:
    """One ledger row: a spend reserved (and possibly committed) before release."""

    id: int
    key: str
    site: str
    mechanism: str
    epsilon: float
    delta: float
    noise_multiplier: float | None
    sample_rate: float | None
    steps: int | None
    noise_std: float | None
    sensitivity: float | None
    round: int | None
    config_hash: str
    created_at: str
    committed_at: str | None
    status: str

    def to_dict(self) -> dict[str, Any]:
        """Return the row as a plain dict."""
        return asdict(self)

    def event(self) -> Event:
        """The accounting event this row records (pure events keep their ε in ``epsilon``).

        Raises:
            PrivacyError: an unknown mechanism or invalid stored parameters.
        """
        params = {c: getattr(self, c) for c in PARAMETER_COLUMNS if getattr(self, c) is not None}
        return event_from(self.mechanism, params or {"epsilon": self.epsilon})


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def budget_config_hash(site: str, epsilon_budget: float, delta: float) -> str:
    """sha256 of the canonical JSON of a site's budget settings (the default config hash)."""
    doc = json.dumps(
        {"site": site, "epsilon_budget": epsilon_budget, "delta": delta}, sort_keys=True, separators=(",", ":")
    )
    return "sha256:" + hashlib.sha256(doc.encode()).hexdigest()


def _check_round(round_: int | None) -> int | None:
    if round_ is None:
        return None
    if isinstance(round_, bool) or not isinstance(round_, int) or round_ < 0:
        raise PrivacyError(f"round must be a non-negative int or None, got {round_!r}")
    return round_


def _check_key(key: str | None) -> str:
    if key is None:
        return uuid.uuid4().hex
    if not isinstance(key, str) or not key or len(key) > _MAX_KEY_LEN:
        raise PrivacyError(
            f"idempotency key must be a non-empty string of at most {_MAX_KEY_LEN} characters, got {key!r}"
        )
    return key


def dpsgd_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """Epsilon of composed DP-SGD events at ``delta`` by Opacus' RDP curves and conversion.

    Imports opacus (and therefore torch) only when ``history`` is non-empty.
    """
    return Accountant([DpSgd(float(s), float(q), int(n)) for s, q, n in history]).rdp_epsilon(delta)


class PrivacyLedger(_LedgerFile):
    """The durable privacy-budget ledger of one site.

    ``config_hash`` is stored on every row (default: :func:`budget_config_hash`
    of site, budget and delta).

    Raises:
        PrivacyError: bad arguments.
        LedgerError: the file is unreadable, corrupt, truncated, or belongs to
            another site or delta.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        site: str,
        epsilon_budget: float | None,
        delta: float,
        config_hash: str | None = None,
    ) -> None:
        """``epsilon_budget`` is the site YAML's budget (None: the one recorded in the ledger).

        Raises:
            PrivacyError: bad arguments.
            LedgerError: the file is corrupt or another site's, or ``epsilon_budget`` is above
                the recorded budget (raise it with :meth:`record_budget` first).
        """
        if not isinstance(site, str) or not site:
            raise PrivacyError(f"site must be a non-empty string, got {site!r}")
        self.path = Path(path)
        self.site = site
        configured = None if epsilon_budget is None else positive_finite("epsilon_budget", epsilon_budget)
        self.delta = positive_finite("delta", delta)
        if self.delta >= 1:
            raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
        if config_hash is not None and (not isinstance(config_hash, str) or not config_hash):
            raise PrivacyError(f"config_hash must be a non-empty string, got {config_hash!r}")
        self._lock = threading.Lock()
        # the initial budget of a new ledger; None (no YAML budget) is refused if there is none yet
        self.epsilon_budget = configured  # type: ignore[assignment]
        self._create_if_missing()
        self._conn = self._open()
        self.epsilon_budget = self._effective_budget(configured)
        self.config_hash = config_hash or budget_config_hash(site, self.epsilon_budget, self.delta)

    def _effective_budget(self, configured: float | None) -> float:
        recorded = self.recorded_budget()
        if configured is None:
            return recorded
        if configured > recorded:
            self._conn.close()
            raise LedgerError(
                f"site {self.site!r}: the site YAML sets epsilon_budget {configured:g} but the ledger {self.path} "
                f"records {recorded:g}. Editing the YAML cannot raise a budget; record the change with "
                f"`cuvil-edge privacy raise-budget --site SITE.yaml --reason TEXT` (it is kept in the ledger)."
            )
        if configured < recorded:
            logger.warning(
                "site %r: the site YAML lowers the budget to %g (ledger records %g); enforcing %g",
                self.site,
                configured,
                recorded,
                configured,
            )
        return configured

    def recorded_budget(self) -> float:
        """The latest budget recorded in the ledger.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        history = self.budget_history()
        latest = history[-1]["epsilon_budget"] if history else None
        if not isinstance(latest, float) or not math.isfinite(latest) or latest <= 0:
            raise LedgerError(f"privacy ledger {self.path} records no valid budget; restore it from backup")
        return latest

    def budget_history(self) -> list[dict[str, Any]]:
        """Every recorded budget, oldest first: ``{"epsilon_budget", "reason", "created_at"}``.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._lock:
            try:
                rows = self._conn.execute(
                    "SELECT epsilon_budget, reason, created_at FROM budget ORDER BY id"
                ).fetchall()
            except sqlite3.Error as e:
                raise LedgerError(f"cannot read privacy ledger {self.path}: {e}") from e
        return [{"epsilon_budget": b, "reason": r, "created_at": t} for b, r, t in rows]

    def record_budget(self, epsilon_budget: float, reason: str) -> None:
        """Record a new total budget for the site (raising or lowering), with its reason.

        Raises:
            PrivacyError: a non-positive budget, one below what is already spent, or no reason.
            LedgerError: the ledger cannot be written.
        """
        budget = positive_finite("epsilon_budget", epsilon_budget)
        if not isinstance(reason, str) or not reason.strip():
            raise PrivacyError("a budget change needs a reason (who approved it and why); it is kept in the ledger")
        with self._lock, self._transaction() as conn:
            spent = float(self._total(self._rows(conn)))
            if budget < spent:
                raise PrivacyError(
                    f"site {self.site!r} has already spent ε={spent:.4g}; a budget of {budget:g} "
                    "would be exceeded already"
                )
            conn.execute(
                "INSERT INTO budget (epsilon_budget, reason, created_at) VALUES (?, ?, ?)",
                (budget, reason.strip(), _now()),
            )
        self.epsilon_budget = budget
        self.config_hash = budget_config_hash(self.site, budget, self.delta)
        logger.warning("site %r: privacy budget set to %g (%s)", self.site, budget, reason.strip())

    def close(self) -> None:
        """Close the database connection."""
        with self._lock:
            self._conn.close()

    def __enter__(self) -> PrivacyLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- reading -------------------------------------------------------------
    def _rows(self, conn: sqlite3.Connection, where: str = "", args: tuple = ()) -> list[Reservation]:
        try:
            raw = conn.execute(f"SELECT {_COLUMNS} FROM events {where} ORDER BY id", args)
            return [self._to_reservation(r) for r in raw.fetchall()]
        except sqlite3.Error as e:
            raise LedgerError(f"cannot read privacy ledger {self.path}: {e}") from e

    def _to_reservation(self, r: tuple) -> Reservation:
        res = Reservation(*r)
        try:
            if not isinstance(res.epsilon, float) or not math.isfinite(res.epsilon) or res.epsilon < 0:
                raise PrivacyError(f"epsilon {res.epsilon!r}")
            res.event()
        except (PrivacyError, TypeError) as e:
            raise LedgerError(f"privacy ledger {self.path}: row {res.id} is corrupt ({e}): {res}") from e
        return res

    def _total(self, rows: list[Reservation], extra: Event | None = None) -> Fraction:
        # Reserved rows count (fail closed); only aborted ones do not.
        events = [r.event() for r in rows if r.status != "aborted"]
        if extra is not None:
            events.append(extra)
        return Accountant(events).epsilon_exact(self.delta)

    def spent(self) -> float:
        """Total epsilon spent (reserved or committed) at the ledger's delta.

        min(PLD composition, basic composition); see :mod:`.accounting`.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._lock:
            return float(self._total(self._rows(self._conn)))

    def remaining(self) -> float:
        """Budget left (never negative).

        Raises:
            LedgerError: the ledger cannot be read.
        """
        return max(0.0, self.epsilon_budget - self.spent())

    def would_exceed(self, event: Event) -> tuple[bool, float]:
        """Whether adding ``event`` would exceed the budget, and the total it would make.

        Raises:
            PrivacyError: not an event.
            LedgerError: the ledger cannot be read.
        """
        with self._lock:
            total = self._total(self._rows(self._conn), extra=event)
        return total > Fraction(self.epsilon_budget), float(total)

    def history(self) -> list[dict[str, Any]]:
        """Every row, oldest first, as dicts.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._lock:
            return [r.to_dict() for r in self._rows(self._conn)]

    def rounds(self) -> list[dict[str, Any]]:
        """Per round (in order of each round's last row): its rows and the total ε after it.

        ``spent_after`` is the site's total (all earlier rows included, aborted
        ones excluded) once the round's last row is counted.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._lock:
            rows = self._rows(self._conn)
        live = [r for r in rows if r.status != "aborted"]
        totals = dict(
            zip((r.id for r in live), cumulative_epsilons([r.event() for r in live], self.delta), strict=True)
        )
        out: dict[int | None, dict[str, Any]] = {}
        spent = 0.0
        for r in rows:
            spent = totals.get(r.id, spent)
            entry = out.pop(r.round, None) or {"round": r.round, "rows": []}
            entry["rows"].append(r.to_dict())
            entry["spent_after"] = spent
            out[r.round] = entry  # re-inserted: dict order follows each round's last row
        return list(out.values())

    # ---- writing -------------------------------------------------------------
    def reserve(self, event: Event, *, key: str | None = None, round: int | None = None) -> Reservation:
        """Claim ``key`` exclusively and reserve ``event``'s spend, before anything is computed.

        Every mechanism is one accounting event (:mod:`.accounting`); the row stores its
        parameters, its standalone ε at the ledger's δ, and 0 as δ for pure events. A key is
        claimed once for ever: a second reservation with it (a replayed or duplicated message,
        a concurrent delivery, a retry after a crash) is refused, whatever the first one's status.

        Raises:
            ReplayError: ``key`` was already claimed; nothing may be computed again.
            BudgetExhaustedError: the budget would be exceeded; nothing was reserved.
            PrivacyError: not an event, or a bad key or round.
            LedgerError: the ledger cannot be read or written.
        """
        if not is_event(event):
            raise PrivacyError(f"not a privacy event: {event!r}")
        key, round_ = _check_key(key), _check_round(round)
        pure = is_pure(event)
        params = event_parameters(event)
        fields = {c: params.get(c) for c in PARAMETER_COLUMNS}
        fields.update(
            mechanism=event.mechanism,
            delta=0.0 if pure else self.delta,
            epsilon=params["epsilon"] if pure else Accountant([event]).epsilon(self.delta),
        )
        with self._lock, self._transaction() as conn:
            existing = self._rows(conn, "WHERE idempotency_key = ?", (key,))
            if existing:
                raise ReplayError(
                    f"site {self.site!r}: key {key!r} was already claimed (round {existing[0].round}, "
                    f"{existing[0].status}); a replayed or duplicated request is never computed or released "
                    "again. Use the reply already sent."
                )
            rows = self._rows(conn)
            before = self._total(rows)
            after = self._total(rows, extra=event)
            if after > Fraction(self.epsilon_budget):
                raise BudgetExhaustedError(
                    f"site {self.site!r}: privacy budget exhausted: spent {float(before):.6g}, "
                    f"requested {float(after - before):.6g} ({event.mechanism}) would make "
                    f"{float(after):.6g} > budget {self.epsilon_budget:.6g}; nothing was "
                    "released. Wait for a new budget period or lower the request."
                )
            conn.execute(
                f"INSERT INTO events ({_COLUMNS.replace('id, ', '', 1)}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 'reserved')",
                (
                    key,
                    self.site,
                    fields["mechanism"],
                    fields["epsilon"],
                    fields["delta"],
                    *(fields[p] for p in PARAMETER_COLUMNS),
                    round_,
                    self.config_hash,
                    _now(),
                ),
            )
            row = self._rows(conn, "WHERE idempotency_key = ?", (key,))[0]
        logger.info("site %r reserved %s eps=%.6g key=%s", self.site, row.mechanism, row.epsilon, key)
        return row

    @contextmanager
    def claim(self, event: Event, *, key: str | None = None, round: int | None = None) -> Iterator[Reservation]:
        """The one way a site is charged: reserve ``event`` under ``key`` (exclusively, before anything
        is computed), run the block, then commit; if the block raises, abort (nothing computed under
        the claim left the process) and re-raise. A crash inside the block leaves the row reserved,
        which over-counts, never under-counts. Training, evaluation and inference all charge this way.

        Raises:
            ReplayError, BudgetExhaustedError, PrivacyError, LedgerError: as :meth:`reserve`
                (nothing ran); LedgerError also when the commit cannot be written.
        """
        reservation = self.reserve(event, key=key, round=round)
        try:
            yield reservation
        except BaseException:
            self.abort(reservation)
            raise
        self.commit(reservation)

    def commit(self, reservation: Reservation) -> Reservation:
        """Mark a reserved spend committed (its value was released); only the holder of the
        reservation moves it from ``reserved`` to ``committed``, once.

        Raises:
            LedgerError: the row is missing, aborted or already committed, or the ledger
                cannot be written.
        """
        with self._lock, self._transaction() as conn:
            changed = conn.execute(
                "UPDATE events SET status = 'committed', committed_at = ? "
                "WHERE idempotency_key = ? AND status = 'reserved'",
                (_now(), reservation.key),
            ).rowcount
            rows = self._rows(conn, "WHERE idempotency_key = ?", (reservation.key,))
            if changed != 1:
                raise LedgerError(
                    f"privacy ledger {self.path}: reservation {reservation.key!r} was "
                    "already committed by another caller; this value is discarded."
                )
            if not rows or rows[0].status != "committed":
                raise LedgerError(
                    f"privacy ledger {self.path}: cannot commit reservation "
                    f"{reservation.key!r}: {'missing' if not rows else rows[0].status}"
                )
            return rows[0]

    def abort(self, reservation: Reservation) -> Reservation:
        """Give a reserved spend back. Call only when certain no value computed under it left the process.

        Idempotent for an already aborted row.

        Raises:
            LedgerError: the row is missing or committed (a released value is
                never un-counted), or the ledger cannot be written.
        """
        with self._lock, self._transaction() as conn:
            conn.execute(
                "UPDATE events SET status = 'aborted' WHERE idempotency_key = ? AND status = 'reserved'",
                (reservation.key,),
            )
            rows = self._rows(conn, "WHERE idempotency_key = ?", (reservation.key,))
            if not rows or rows[0].status != "aborted":
                raise LedgerError(
                    f"privacy ledger {self.path}: cannot abort reservation {reservation.key!r}: "
                    f"{'missing' if not rows else 'it was committed (its value was released)'}"
                )
        logger.info("site %r aborted reservation %s", self.site, reservation.key)
        return rows[0]

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn, self.path)
