"""The per-record train / evaluation split (DESIGN §3 "Privacy").

A record belongs to evaluation when the keyed hash of that record alone falls below
``eval_fraction``, else to training:

    u = HMAC-SHA256(key, DOMAIN, dtype, shape, feature bytes, label)[:8] / 2^64;  eval iff u < eval_fraction

(the parts length-prefixed, :func:`cuvil_edge.private_dir.mac`). The features are the record as the
model sees it (float32, the model input's shape, little-endian) and the label its class index, so
every source - npz, csv, image-folder, the demo's digits partition - is split by the same rule.
Nothing else is read: not the record's position, not the dataset size, not the other records. So
adding, removing or moving one record changes the membership of that record only, a neighbouring
dataset moves the evaluation counts ``(correct, total)`` by at most ``(1, 1)``, and DP-SGD's training
sets of neighbouring datasets differ in at most that one record.

- **Duplicates.** Identical records (same features and label) get the same membership: both train,
  or both evaluation. Records that decode to the same pixels (two image files) are identical here.
- **Order.** Inside each part records are sorted by their keyed hash, not kept in file order, so
  the order leaks no position either (DP-SGD samples by Poisson anyway, and counts ignore order).
- **Key.** The agent uses a per-site secret key, 32 random bytes kept 0600 in its state directory
  (:data:`SPLIT_KEY_FILE`, :func:`load_split_key`), so nobody without the device can tell which part
  a given record is in. A new key re-draws every record's membership once.
- **Fraction.** The evaluation part holds ``eval_fraction`` of the records in expectation (each
  record independently); a small dataset can have an empty part, which the callers handle.
"""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import numpy as np

from cuvil_edge import private_dir
from cuvil_edge.datasets.records import Records
from cuvil_edge.errors import StateError

#: The split key's file in the site's state directory.
SPLIT_KEY_FILE = "split.key"
#: Domain separation: no other MAC under the same key authenticates these bytes.
DOMAIN = b"cuvil-edge record split v1"
#: The key of callers with no state directory (benchmarks, tests): the rule stays per record, but
#: anyone who holds a record can compute its part. The agent never uses it.
PUBLIC_SPLIT_KEY = b"cuvil-edge public split key (benchmarks only)"


def load_split_key(state_dir: Path) -> bytes:
    """The site's secret split key, ``<state_dir>/split.key`` (made 0600 on first use).

    Raises:
        UnsafePathError: the key file is a link, another user's, readable by others, or not a key.
        StateError: the key cannot be written or read.
    """
    path = Path(state_dir) / SPLIT_KEY_FILE
    try:
        return private_dir.load_or_create_key(path, what="the record split key")
    except OSError as e:
        raise StateError(
            f"cannot create or read the record split key {path}: {e}; check the state "
            "directory is writable by the agent"
        ) from e


def record_digests(split: Records, key: bytes) -> list[bytes]:
    """The keyed hash of each record of ``split``: a function of that record (and ``key``) alone."""
    x = np.ascontiguousarray(split.x, dtype="<f4")
    y = np.ascontiguousarray(split.y, dtype="<i8")
    dtype, shape = x.dtype.str.encode(), repr(tuple(x.shape[1:])).encode()
    return [
        private_dir.mac(key, DOMAIN, dtype, shape, row.tobytes(), label.tobytes())
        for row, label in zip(x, y, strict=True)
    ]


def in_eval(digests: list[bytes], eval_fraction: float) -> np.ndarray:
    """Whether each record (by its digest) belongs to evaluation: its first 8 bytes as a number in
    [0, 1) below ``eval_fraction`` (compared exactly, as integers)."""
    threshold = int(Fraction(eval_fraction) * 2**64)
    return np.array([int.from_bytes(d[:8], "big") < threshold for d in digests], dtype=bool)


def split_records(split: Records, eval_fraction: float, *, key: bytes) -> tuple[Records, Records]:
    """(train, eval) parts of ``split`` by the per-record rule of this module, each sorted by the
    records' keyed hashes."""
    digests = record_digests(split, key)
    member = in_eval(digests, eval_fraction)
    order = np.array(sorted(range(len(digests)), key=digests.__getitem__), dtype=np.int64)
    train, evaluation = order[~member[order]], order[member[order]]
    return Records(split.x[train], split.y[train]), Records(split.x[evaluation], split.y[evaluation])
