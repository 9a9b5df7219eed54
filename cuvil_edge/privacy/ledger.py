"""Durable per-site privacy-budget ledger (write-ahead, fail closed).

One SQLite database per site, in WAL mode with ``synchronous=FULL`` so every
commit is fsynced. A spend goes through two steps:

1. ``reserve_*``: ``BEGIN IMMEDIATE`` (one writer at a time, across
   processes), recompute the total over every non-aborted row plus the new
   event, refuse with :class:`BudgetExhaustedError` if it would exceed the
   budget, else insert a ``reserved`` row (mechanism, parameters, standalone
   (ε, δ), round, idempotency key, UTC time, config hash) and ``COMMIT``.
   Only then may the caller compute a noisy value.
2. ``commit``: mark the row ``committed`` once the value has been released,
   or ``abort`` it when it is certain nothing left the process.

A row left ``reserved`` by a crash still counts (fail closed). A retry with
the same idempotency key returns the existing row and does not count twice.
A file that is unreadable, truncated or not a ledger raises
:class:`LedgerError`; the ledger is never silently reset.

Accounting (:mod:`cuvil_edge.privacy.accounting`): DP-SGD events are stored
as ``(noise_multiplier, sample_rate, steps)``, Gaussian releases as
``(noise_std, sensitivity)``, Laplace and other pure releases as their ε; the total is
min(all events composed by RDP, basic composition) at the ledger's δ.
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
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any

from cuvil_edge.errors import BudgetExhaustedError, LedgerError, PrivacyError
from cuvil_edge.privacy._checks import positive_finite
from cuvil_edge.privacy._ledger_db import _COLUMNS, SCHEMA_VERSION, _LedgerFile, _Transaction
from cuvil_edge.privacy.accounting import (
    Accountant, DpSgd, Event, Gaussian, Laplace, PureDp, cumulative_epsilons,
)

__all__ = ["LEDGER_FILENAME", "SCHEMA_VERSION", "PrivacyLedger", "Reservation", "budget_config_hash",
           "dpsgd_epsilon"]

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
        """The accounting event this row records.

        Raises:
            PrivacyError: the stored parameters are invalid.
        """
        if self.mechanism == "dpsgd":
            return DpSgd(self.noise_multiplier, self.sample_rate, self.steps)  # type: ignore[arg-type]
        if self.mechanism == "gaussian":
            return Gaussian(self.noise_std, self.sensitivity)  # type: ignore[arg-type]
        if self.mechanism == "pure":
            return PureDp(self.epsilon)
        return Laplace(self.epsilon)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


def budget_config_hash(site: str, epsilon_budget: float, delta: float) -> str:
    """sha256 of the canonical JSON of a site's budget settings (the default config hash)."""
    doc = json.dumps({"site": site, "epsilon_budget": epsilon_budget, "delta": delta},
                     sort_keys=True, separators=(",", ":"))
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
            f"idempotency key must be a non-empty string of at most {_MAX_KEY_LEN} "
            f"characters, got {key!r}"
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
        self, path: str | os.PathLike[str], *, site: str, epsilon_budget: float, delta: float,
        config_hash: str | None = None,
    ) -> None:
        if not isinstance(site, str) or not site:
            raise PrivacyError(f"site must be a non-empty string, got {site!r}")
        self.path = Path(path)
        self.site = site
        self.epsilon_budget = positive_finite("epsilon_budget", epsilon_budget)
        self.delta = positive_finite("delta", delta)
        if self.delta >= 1:
            raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
        if config_hash is not None and (not isinstance(config_hash, str) or not config_hash):
            raise PrivacyError(f"config_hash must be a non-empty string, got {config_hash!r}")
        self.config_hash = config_hash or budget_config_hash(site, self.epsilon_budget, self.delta)
        self._lock = threading.Lock()
        self._create_if_missing()
        self._conn = self._open()

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

        min(RDP composition, basic composition); see :mod:`.accounting`.

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

    def would_exceed_dpsgd(self, sigma: float, q: float, steps: int) -> tuple[bool, float]:
        """Whether a DP-SGD run (sigma, q, steps) would exceed the budget, and the new total.

        Raises:
            PrivacyError: bad parameters.
            LedgerError: the ledger cannot be read.
        """
        return self.would_exceed(DpSgd(sigma, q, steps))

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
        totals = dict(zip((r.id for r in live), cumulative_epsilons([r.event() for r in live], self.delta)))
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
    def reserve_laplace(self, epsilon: float, key: str | None = None,
                        round: int | None = None) -> Reservation:
        """Reserve a Laplace release (pure epsilon-DP) before computing it.

        Composed by the continuous Laplace RDP curve: use it for continuous
        Laplace or a discrete Laplace on a fine grid (integer sensitivity of
        at least ~2^10 grid steps); otherwise use :meth:`reserve_pure`.

        Raises:
            PrivacyError: bad parameters, or the key was used for a different event.
            BudgetExhaustedError: the budget would be exceeded; nothing was reserved.
            LedgerError: the ledger cannot be read or written.
        """
        event = Laplace(epsilon)
        fields = dict(mechanism="laplace", epsilon=event.epsilon, delta=0.0)
        return self._reserve(event, fields, _check_key(key), _check_round(round))

    def reserve_pure(self, epsilon: float, key: str | None = None,
                     round: int | None = None) -> Reservation:
        """Reserve any pure epsilon-DP release (e.g. a discrete Laplace on integer counts).

        Composed by the randomized-response RDP curve, which bounds every
        ε-DP mechanism; use it where the continuous Laplace curve of
        :meth:`reserve_laplace` may under-count (small integer sensitivity).

        Raises:
            PrivacyError: bad parameters, or the key was used for a different event.
            BudgetExhaustedError: the budget would be exceeded; nothing was reserved.
            LedgerError: the ledger cannot be read or written.
        """
        event = PureDp(epsilon)
        fields = dict(mechanism="pure", epsilon=event.epsilon, delta=0.0)
        return self._reserve(event, fields, _check_key(key), _check_round(round))

    def reserve_gaussian(self, sigma: float, sensitivity: float, key: str | None = None,
                         round: int | None = None) -> Reservation:
        """Reserve a Gaussian release (noise std ``sigma``, L2 ``sensitivity``) before computing it.

        Raises:
            PrivacyError: bad parameters, or the key was used for a different event.
            BudgetExhaustedError: the budget would be exceeded; nothing was reserved.
            LedgerError: the ledger cannot be read or written.
        """
        event = Gaussian(sigma, sensitivity)
        fields = dict(mechanism="gaussian", epsilon=Accountant([event]).rdp_epsilon(self.delta),
                      delta=self.delta, noise_std=event.noise_std, sensitivity=event.sensitivity)
        return self._reserve(event, fields, _check_key(key), _check_round(round))

    def reserve_dpsgd(self, sigma: float, q: float, steps: int, key: str | None = None,
                      round: int | None = None) -> Reservation:
        """Reserve a whole planned DP-SGD run (sigma, q, steps) before training.

        Raises:
            PrivacyError: bad parameters, or the key was used for a different event.
            BudgetExhaustedError: the budget would be exceeded; nothing was reserved.
            LedgerError: the ledger cannot be read or written.
        """
        event = DpSgd(sigma, q, steps)
        fields = dict(mechanism="dpsgd", epsilon=Accountant([event]).rdp_epsilon(self.delta),
                      delta=self.delta, noise_multiplier=event.noise_multiplier,
                      sample_rate=event.sample_rate, steps=event.steps)
        return self._reserve(event, fields, _check_key(key), _check_round(round))

    def _reserve(self, event: Event, fields: dict[str, Any], key: str, round_: int | None) -> Reservation:
        params = ("noise_multiplier", "sample_rate", "steps", "noise_std", "sensitivity")
        fields = {p: None for p in params} | fields
        with self._lock, self._transaction() as conn:
            existing = self._rows(conn, "WHERE idempotency_key = ?", (key,))
            if existing:
                return self._same_event(existing[0], fields, round_)
            rows = self._rows(conn)
            before = self._total(rows)
            after = self._total(rows, extra=event)
            if after > Fraction(self.epsilon_budget):
                raise BudgetExhaustedError(
                    f"site {self.site!r}: privacy budget exhausted: spent {float(before):.6g}, "
                    f"requested {float(after - before):.6g} ({fields['mechanism']}) would make "
                    f"{float(after):.6g} > budget {self.epsilon_budget:.6g}; nothing was "
                    "released. Wait for a new budget period or lower the request."
                )
            conn.execute(
                f"INSERT INTO events ({_COLUMNS.replace('id, ', '', 1)}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 'reserved')",
                (key, self.site, fields["mechanism"], fields["epsilon"], fields["delta"],
                 *(fields[p] for p in params), round_, self.config_hash, _now()),
            )
            row = self._rows(conn, "WHERE idempotency_key = ?", (key,))[0]
        logger.info("site %r reserved %s eps=%.6g key=%s", self.site, row.mechanism, row.epsilon, key)
        return row

    @staticmethod
    def _same_event(row: Reservation, fields: dict[str, Any], round_: int | None) -> Reservation:
        mine = {k: getattr(row, k) for k in fields} | {"round": row.round}
        if mine != fields | {"round": round_}:
            raise PrivacyError(
                f"idempotency key {row.key!r} was already used for a different event "
                f"({mine}); use a fresh key for a new release."
            )
        if row.status == "aborted":
            raise PrivacyError(f"idempotency key {row.key!r} was aborted; use a fresh key for a new release.")
        return row

    def commit(self, reservation: Reservation, *, exclusive: bool = False) -> Reservation:
        """Mark a reserved spend committed (its value was released).

        Idempotent unless ``exclusive``: then only the caller that moves the row
        from ``reserved`` to ``committed`` succeeds (a release uses this so two
        concurrent retries with one key cannot both publish a value).

        Raises:
            LedgerError: the row is missing or aborted, ``exclusive`` and it was
                already committed, or the ledger cannot be written.
        """
        with self._lock, self._transaction() as conn:
            changed = conn.execute(
                "UPDATE events SET status = 'committed', committed_at = ? "
                "WHERE idempotency_key = ? AND status = 'reserved'",
                (_now(), reservation.key),
            ).rowcount
            rows = self._rows(conn, "WHERE idempotency_key = ?", (reservation.key,))
            if exclusive and changed != 1:
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
            conn.execute("UPDATE events SET status = 'aborted' WHERE idempotency_key = ? AND status = 'reserved'",
                         (reservation.key,))
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
