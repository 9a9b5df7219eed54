"""Durable per-site privacy-budget ledger (write-ahead, fail closed).

One SQLite database per site, in WAL mode with ``synchronous=FULL`` so every
commit is fsynced. A spend goes through two steps:

1. ``reserve_*``: ``BEGIN IMMEDIATE`` (one writer at a time, across
   processes), recompute the total over every non-aborted row plus the new
   event, refuse with :class:`BudgetExhaustedError` if it would exceed the
   budget, else insert a ``reserved`` row and ``COMMIT``. Only then may the
   caller compute a noisy value.
2. ``commit``: mark the row ``committed`` once the value has been released.

A row left ``reserved`` by a crash still counts (fail closed). A retry with
the same idempotency key returns the existing row and does not count twice.
A file that is unreadable, truncated or not a ledger raises
:class:`LedgerError`; the ledger is never silently reset.

Accounting: DP-SGD events are stored as ``(noise_multiplier, sample_rate,
steps)`` and composed tightly with Opacus' ``RDPAccountant`` at the ledger's
delta; Laplace events are pure epsilon-DP and summed exactly. The two groups
are then combined by basic composition (epsilons add, deltas add: the total
is (spent, ledger delta)), which is always valid though looser than composing
everything under RDP.
"""

from __future__ import annotations

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
from cuvil_edge.privacy._checks import int_at_least, positive_finite

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_MAX_KEY_LEN = 200

_SCHEMA = """
CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE events (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key  TEXT NOT NULL UNIQUE,
    site             TEXT NOT NULL,
    mechanism        TEXT NOT NULL CHECK (mechanism IN ('laplace', 'dpsgd')),
    epsilon          REAL NOT NULL,   -- laplace: pure eps; dpsgd: standalone eps at delta
    delta            REAL NOT NULL,
    noise_multiplier REAL,
    sample_rate      REAL,
    steps            INTEGER,
    round            INTEGER,
    created_at       TEXT NOT NULL,
    committed_at     TEXT,
    status           TEXT NOT NULL CHECK (status IN ('reserved', 'committed', 'aborted')),
    CHECK ((mechanism = 'laplace' AND noise_multiplier IS NULL AND sample_rate IS NULL
            AND steps IS NULL)
        OR (mechanism = 'dpsgd' AND noise_multiplier IS NOT NULL AND sample_rate IS NOT NULL
            AND steps IS NOT NULL))
);
"""

_COLUMNS = (
    "id, idempotency_key, site, mechanism, epsilon, delta, noise_multiplier, "
    "sample_rate, steps, round, created_at, committed_at, status"
)


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
    round: int | None
    created_at: str
    committed_at: str | None
    status: str

    def to_dict(self) -> dict[str, Any]:
        """Return the row as a plain dict."""
        return asdict(self)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="microseconds")


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


def _check_dpsgd(sigma: float, q: float, steps: int) -> tuple[float, float, int]:
    sigma = positive_finite("noise_multiplier", sigma)
    q = positive_finite("sample_rate", q)
    if q > 1:
        raise PrivacyError(f"sample_rate must be in (0, 1], got {q!r}")
    return sigma, q, int_at_least("steps", steps)


def dpsgd_epsilon(history: list[tuple[float, float, int]], delta: float) -> float:
    """Epsilon of composed DP-SGD events at ``delta`` by Opacus' RDP accountant.

    Imports opacus (and therefore torch) only when ``history`` is non-empty.
    """
    if not history:
        return 0.0
    from opacus.accountants import RDPAccountant  # lazy: pulls in torch

    accountant = RDPAccountant()
    accountant.history = [(float(s), float(q), int(n)) for s, q, n in history]
    return float(accountant.get_epsilon(delta=delta))


class PrivacyLedger:
    """The durable privacy-budget ledger of one site.

    Raises:
        PrivacyError: bad arguments.
        LedgerError: the file is unreadable, corrupt, truncated, or belongs to
            another site or delta.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, site: str, epsilon_budget: float, delta: float
    ) -> None:
        if not isinstance(site, str) or not site:
            raise PrivacyError(f"site must be a non-empty string, got {site!r}")
        self.path = Path(path)
        self.site = site
        self.epsilon_budget = positive_finite("epsilon_budget", epsilon_budget)
        self.delta = positive_finite("delta", delta)
        if self.delta >= 1:
            raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
        self._lock = threading.Lock()
        self._create_if_missing()
        self._conn = self._open()

    # ---- opening -------------------------------------------------------------
    def _create_if_missing(self) -> None:
        """Create a fresh ledger atomically: build it aside, then hard-link it in."""
        if self.path.exists():
            return
        wal = Path(str(self.path) + "-wal")
        if wal.exists():
            raise LedgerError(
                f"privacy ledger {self.path} is missing but its WAL file {wal} exists; "
                "the ledger may have been deleted. Restore it; releases are refused."
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex}.init")
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA synchronous=FULL")
                conn.executescript(_SCHEMA)
                conn.executemany(
                    "INSERT INTO meta(name, value) VALUES (?, ?)",
                    [
                        ("schema_version", str(SCHEMA_VERSION)),
                        ("site", self.site),
                        ("delta", repr(self.delta)),
                        ("epsilon_budget", repr(self.epsilon_budget)),
                        ("created_at", _now()),
                    ],
                )
            finally:
                conn.close()
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            try:
                os.link(tmp, self.path)  # fails if another process created it first
            except FileExistsError:
                pass
            _fsync_dir(self.path.parent)
        except OSError as e:
            raise LedgerError(f"cannot create privacy ledger {self.path}: {e}") from e
        finally:
            tmp.unlink(missing_ok=True)
        logger.info("created privacy ledger %s for site %r", self.path, self.site)

    def _open(self) -> sqlite3.Connection:
        try:
            if self.path.stat().st_size == 0:
                raise LedgerError(
                    f"privacy ledger {self.path} is empty (truncated?); releases are refused. "
                    "Restore it from backup; never delete it to reset the budget."
                )
            conn = sqlite3.connect(
                self.path, isolation_level=None, timeout=30.0, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as e:
            raise LedgerError(f"cannot open privacy ledger {self.path}: {e}") from e
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            rows = conn.execute("PRAGMA integrity_check").fetchall()
            if rows != [("ok",)]:
                raise LedgerError(
                    f"privacy ledger {self.path} failed its integrity check "
                    f"({'; '.join(str(r[0]) for r in rows[:3])}); releases are refused. "
                    "Restore it from backup."
                )
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            conn.execute(f"SELECT {_COLUMNS} FROM events LIMIT 0")
        except sqlite3.Error as e:
            conn.close()
            raise LedgerError(
                f"privacy ledger {self.path} is unreadable or not a ledger ({e}); "
                "releases are refused. Restore it from backup."
            ) from e
        except LedgerError:
            conn.close()
            raise
        self._check_meta(meta, conn)
        return conn

    def _check_meta(self, meta: dict[str, str], conn: sqlite3.Connection) -> None:
        problem = None
        if meta.get("schema_version") != str(SCHEMA_VERSION):
            problem = f"schema version {meta.get('schema_version')!r} != {SCHEMA_VERSION}"
        elif meta.get("site") != self.site:
            problem = f"it belongs to site {meta.get('site')!r}, not {self.site!r}"
        elif meta.get("delta") != repr(self.delta):
            problem = f"it was created with delta {meta.get('delta')}, not {self.delta!r}"
        if problem:
            conn.close()
            raise LedgerError(f"privacy ledger {self.path}: {problem}; releases are refused.")
        if meta.get("epsilon_budget") != repr(self.epsilon_budget):
            logger.warning(
                "privacy ledger %s: budget changed from %s to %r by configuration",
                self.path, meta.get("epsilon_budget"), self.epsilon_budget,
            )

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
        bad = (
            not isinstance(res.epsilon, float) or not math.isfinite(res.epsilon) or res.epsilon < 0
            or res.mechanism == "dpsgd" and not (
                isinstance(res.noise_multiplier, float) and res.noise_multiplier > 0
                and isinstance(res.sample_rate, float) and 0 < res.sample_rate <= 1
                and isinstance(res.steps, int) and res.steps >= 1
            )
        )
        if bad:
            raise LedgerError(f"privacy ledger {self.path}: row {res.id} is corrupt: {res}")
        return res

    def _total(self, rows: list[Reservation], extra_dpsgd: tuple | None = None,
               extra_laplace: float = 0.0) -> Fraction:
        live = [r for r in rows if r.status != "aborted"]  # reserved rows count (fail closed)
        history = [(r.noise_multiplier, r.sample_rate, r.steps) for r in live if r.mechanism == "dpsgd"]
        if extra_dpsgd is not None:
            history.append(extra_dpsgd)
        # Pure-eps Laplace events: exact sum of the stored floats (no rounding drift).
        laplace = sum((Fraction(r.epsilon) for r in live if r.mechanism == "laplace"), Fraction(0))
        laplace += Fraction(extra_laplace)
        # Basic composition between the RDP-composed DP-SGD group and the Laplace group.
        return Fraction(dpsgd_epsilon(history, self.delta)) + laplace

    def spent(self) -> float:
        """Total epsilon spent (reserved or committed) at the ledger's delta.

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

    def would_exceed_dpsgd(self, sigma: float, q: float, steps: int) -> tuple[bool, float]:
        """Whether a DP-SGD run (sigma, q, steps) would exceed the budget, and the new total.

        Raises:
            PrivacyError: bad parameters.
            LedgerError: the ledger cannot be read.
        """
        event = _check_dpsgd(sigma, q, steps)
        with self._lock:
            total = self._total(self._rows(self._conn), extra_dpsgd=event)
        return total > Fraction(self.epsilon_budget), float(total)

    def history(self) -> list[dict[str, Any]]:
        """Every row, oldest first, as dicts.

        Raises:
            LedgerError: the ledger cannot be read.
        """
        with self._lock:
            return [r.to_dict() for r in self._rows(self._conn)]

    # ---- writing -------------------------------------------------------------
    def reserve_laplace(self, epsilon: float, key: str | None = None,
                        round: int | None = None) -> Reservation:
        """Reserve a pure epsilon-DP (Laplace) release before computing it.

        Raises:
            PrivacyError: bad parameters, or the key was used for a different event.
            BudgetExhaustedError: the budget would be exceeded; nothing was reserved.
            LedgerError: the ledger cannot be read or written.
        """
        eps = positive_finite("epsilon", epsilon)
        fields = dict(mechanism="laplace", epsilon=eps, delta=0.0, noise_multiplier=None,
                      sample_rate=None, steps=None)
        return self._reserve(fields, _check_key(key), _check_round(round), extra_laplace=eps)

    def reserve_dpsgd(self, sigma: float, q: float, steps: int, key: str | None = None,
                      round: int | None = None) -> Reservation:
        """Reserve a whole planned DP-SGD run (sigma, q, steps) before training.

        Raises:
            PrivacyError: bad parameters, or the key was used for a different event.
            BudgetExhaustedError: the budget would be exceeded; nothing was reserved.
            LedgerError: the ledger cannot be read or written.
        """
        event = _check_dpsgd(sigma, q, steps)
        fields = dict(mechanism="dpsgd", epsilon=dpsgd_epsilon([event], self.delta),
                      delta=self.delta, noise_multiplier=event[0], sample_rate=event[1],
                      steps=event[2])
        return self._reserve(fields, _check_key(key), _check_round(round), extra_dpsgd=event)

    def _reserve(self, fields: dict[str, Any], key: str, round_: int | None,
                 **extra: Any) -> Reservation:
        with self._lock, self._transaction() as conn:
            existing = self._rows(conn, "WHERE idempotency_key = ?", (key,))
            if existing:
                return self._same_event(existing[0], fields, round_)
            rows = self._rows(conn)
            before = self._total(rows)
            after = self._total(rows, **extra)
            if after > Fraction(self.epsilon_budget):
                raise BudgetExhaustedError(
                    f"site {self.site!r}: privacy budget exhausted: spent {float(before):.6g}, "
                    f"requested {float(after - before):.6g} ({fields['mechanism']}) would make "
                    f"{float(after):.6g} > budget {self.epsilon_budget:.6g}; nothing was "
                    "released. Wait for a new budget period or lower the request."
                )
            conn.execute(
                f"INSERT INTO events ({_COLUMNS.replace('id, ', '', 1)}) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, 'reserved')",
                (key, self.site, fields["mechanism"], fields["epsilon"], fields["delta"],
                 fields["noise_multiplier"], fields["sample_rate"], fields["steps"],
                 round_, _now()),
            )
            row = self._rows(conn, "WHERE idempotency_key = ?", (key,))[0]
        logger.info("site %r reserved %s eps=%.6g key=%s", self.site, row.mechanism,
                    row.epsilon, key)
        return row

    @staticmethod
    def _same_event(row: Reservation, fields: dict[str, Any], round_: int | None) -> Reservation:
        mine = {k: getattr(row, k) for k in fields} | {"round": row.round}
        if mine != fields | {"round": round_}:
            raise PrivacyError(
                f"idempotency key {row.key!r} was already used for a different event "
                f"({mine}); use a fresh key for a new release."
            )
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

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn, self.path)


class _Transaction:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (rollback on any error)."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self.conn, self.path = conn, path

    def __enter__(self) -> sqlite3.Connection:
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise LedgerError(f"cannot lock privacy ledger {self.path}: {e}") from e
        return self.conn

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: object) -> None:
        try:
            self.conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
        except sqlite3.Error as e:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if exc_type is None:
                raise LedgerError(f"cannot write privacy ledger {self.path}: {e}") from e


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
