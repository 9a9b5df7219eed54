"""The ledger's SQLite file: schema, atomic creation, opening with integrity checks, migration.

Private to :mod:`cuvil_edge.privacy.ledger`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import uuid
from datetime import UTC, datetime
from pathlib import Path

from cuvil_edge.errors import LedgerError

logger = logging.getLogger("cuvil_edge.privacy.ledger")

SCHEMA_VERSION = 3

_EVENTS_TABLE = """
CREATE TABLE {name} (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    idempotency_key  TEXT NOT NULL UNIQUE,
    site             TEXT NOT NULL,
    mechanism        TEXT NOT NULL CHECK (mechanism IN ('laplace', 'pure', 'gaussian', 'dpsgd')),
    epsilon          REAL NOT NULL,   -- laplace, pure: pure eps; others: standalone eps at delta
    delta            REAL NOT NULL,
    noise_multiplier REAL,            -- dpsgd
    sample_rate      REAL,            -- dpsgd
    steps            INTEGER,         -- dpsgd
    noise_std        REAL,            -- gaussian
    sensitivity      REAL,            -- gaussian (L2)
    round            INTEGER,
    config_hash      TEXT NOT NULL,
    created_at       TEXT NOT NULL,
    committed_at     TEXT,
    status           TEXT NOT NULL CHECK (status IN ('reserved', 'committed', 'aborted')),
    CHECK ((mechanism = 'dpsgd') = (noise_multiplier IS NOT NULL AND sample_rate IS NOT NULL
                                    AND steps IS NOT NULL)),
    CHECK ((mechanism = 'gaussian') = (noise_std IS NOT NULL AND sensitivity IS NOT NULL)),
    CHECK (mechanism = 'dpsgd' OR (noise_multiplier IS NULL AND sample_rate IS NULL
                                   AND steps IS NULL)),
    CHECK (mechanism = 'gaussian' OR (noise_std IS NULL AND sensitivity IS NULL))
);
"""
_BUDGET_TABLE = """
CREATE TABLE budget (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    epsilon_budget REAL NOT NULL CHECK (epsilon_budget > 0),
    reason         TEXT NOT NULL,
    created_at     TEXT NOT NULL
);
"""
_SCHEMA = (
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);\n"
    + _EVENTS_TABLE.format(name="events")
    + _BUDGET_TABLE
)
#: The event parameter columns; pure events store their ε in ``epsilon`` instead.
PARAMETER_COLUMNS = ("noise_multiplier", "sample_rate", "steps", "noise_std", "sensitivity")

_COLUMNS = (
    "id, idempotency_key, site, mechanism, epsilon, delta, noise_multiplier, sample_rate, steps, "
    "noise_std, sensitivity, round, config_hash, created_at, committed_at, status"
)
_V1_COLUMNS = (  # schema 1 had no gaussian, noise_std, sensitivity or config_hash
    "id, idempotency_key, site, mechanism, epsilon, delta, noise_multiplier, sample_rate, steps, "
    "NULL, NULL, round, 'unrecorded (schema 1)', created_at, committed_at, status"
)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


class _LedgerFile:
    """Creating and opening the file; :class:`PrivacyLedger` adds the accounting."""

    path: Path
    site: str
    delta: float
    epsilon_budget: float

    # ---- opening -------------------------------------------------------------
    def _create_if_missing(self) -> None:
        """Create a fresh ledger atomically: build it aside, then hard-link it in."""
        if self.path.exists():
            return
        if self.epsilon_budget is None:
            raise LedgerError(
                f"there is no privacy ledger at {self.path} yet; the first use needs the site's "
                "epsilon_budget (from its YAML) to create it"
            )
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
                conn.execute(
                    "INSERT INTO budget (epsilon_budget, reason, created_at) VALUES (?, ?, ?)",
                    (self.epsilon_budget, "initial budget (site YAML) when the ledger was created", _now()),
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
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=30.0, check_same_thread=False)
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
            if meta.get("schema_version") == "1":
                meta = self._migrate_v1(conn)
            if meta.get("schema_version") == "2":
                meta = self._migrate_v2(conn)
            conn.execute(f"SELECT {_COLUMNS} FROM events LIMIT 0")
            conn.execute("SELECT epsilon_budget, reason, created_at FROM budget LIMIT 0")
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

    def _migrate_v1(self, conn: sqlite3.Connection) -> dict[str, str]:
        """Upgrade a schema-1 ledger in one transaction (rows are copied, never dropped)."""
        with _Transaction(conn, self.path):
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            if meta.get("schema_version") == "1":  # another process may have migrated it first
                conn.execute(_EVENTS_TABLE.format(name="events_v2"))
                conn.execute(f"INSERT INTO events_v2 ({_COLUMNS}) SELECT {_V1_COLUMNS} FROM events")
                conn.execute("DROP TABLE events")
                conn.execute("ALTER TABLE events_v2 RENAME TO events")
                conn.execute("UPDATE meta SET value = '2' WHERE name = 'schema_version'")
                logger.warning("privacy ledger %s upgraded from schema 1 to 2", self.path)
            return dict(conn.execute("SELECT name, value FROM meta").fetchall())

    def _migrate_v2(self, conn: sqlite3.Connection) -> dict[str, str]:
        """Schema 3 adds the recorded budget, seeded with the budget the ledger was created with."""
        with _Transaction(conn, self.path):
            meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
            if meta.get("schema_version") == "2":
                conn.execute(_BUDGET_TABLE)
                conn.execute(
                    "INSERT INTO budget (epsilon_budget, reason, created_at) VALUES (?, ?, ?)",
                    (float(meta["epsilon_budget"]), "budget recorded at creation (upgrade to schema 3)", _now()),
                )
                conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION),))
                logger.warning("privacy ledger %s upgraded from schema 2 to %d", self.path, SCHEMA_VERSION)
            return dict(conn.execute("SELECT name, value FROM meta").fetchall())

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
