"""scikit-learn's digits (8x8 images, 10 classes), split non-IID across sites.

A stratified global test set is held out; the rest is split per class by
Dirichlet(alpha) proportions with a fixed seed, so every site sees a skewed
label mix and the split is identical in every process that computes it.

A site's partition is then divided into local train and evaluation records by the per-record rule
of :mod:`cuvil_edge.datasets.split` (a keyed hash of each record), like every other data source.
"""

from __future__ import annotations

import io
import zipfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.datasets.records import Records
from cuvil_edge.errors import ConfigError
from cuvil_edge.extras import require


def _require_sklearn() -> None:
    """The digits come with scikit-learn, which a device reading its own files does not install."""
    require(
        ("sklearn",),
        "the demo's digits data needs scikit-learn (a site's own npz, csv or image files do not)",
        "coordinator",
    )


@lru_cache(maxsize=4)
def _load() -> tuple[np.ndarray, np.ndarray]:
    _require_sklearn()
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype(np.float32)[:, None, :, :]
    return x, data.target.astype(np.int64)


def global_test(test_fraction: float = 0.2) -> Records:
    """The held-out test set the coordinator evaluates on."""
    _, test_idx = _train_test_indices(test_fraction)
    x, y = _load()
    return Records(x[test_idx], y[test_idx])


def site_partition(
    index: int,
    num_sites: int,
    *,
    test_fraction: float = 0.2,
    alpha: float = 0.5,
    seed: int = 7,
    cache_dir: Path | None = None,
) -> Records:
    """Training data of site ``index`` of ``num_sites``.

    With ``cache_dir`` the partition is kept there as an .npz (one file per parameter set), so
    a process that handles one message (Flower's ClientApp on a device) does not import
    scikit-learn and split the data again for every round.

    Raises:
        ConfigError: index out of range.
    """
    if not 0 <= index < num_sites:
        raise ConfigError(f"site partition {index} does not exist; the federation has {num_sites} sites")
    cached = None
    if cache_dir is not None:
        cached = Path(cache_dir) / f"digits-{index}-of-{num_sites}-t{test_fraction}-a{alpha}-s{seed}.npz"
        try:
            with np.load(cached, allow_pickle=False) as f:
                return Records(f["x"], f["y"])
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # absent, torn or damaged: compute it again
    parts = _partitions(num_sites, test_fraction, alpha, seed)
    x, y = _load()
    idx = parts[index]
    split = Records(x[idx], y[idx])
    if cached is not None:
        buffer = io.BytesIO()
        np.savez(buffer, x=split.x, y=split.y)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cached, buffer.getvalue())
        except OSError:
            pass  # a cache only: the next message computes it again
    return split


@lru_cache(maxsize=4)
def _train_test_indices(test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    _require_sklearn()
    from sklearn.model_selection import train_test_split

    _, y = _load()
    train_idx, test_idx = train_test_split(np.arange(len(y)), test_size=test_fraction, stratify=y, random_state=0)
    return np.sort(train_idx), np.sort(test_idx)


@lru_cache(maxsize=8)
def _partitions(num_sites: int, test_fraction: float, alpha: float, seed: int) -> tuple[np.ndarray, ...]:
    train_idx, _ = _train_test_indices(test_fraction)
    _, y = _load()
    rng = np.random.default_rng(seed)
    parts: list[list[int]] = [[] for _ in range(num_sites)]
    for label in range(10):
        members = train_idx[y[train_idx] == label]
        proportions = rng.dirichlet([alpha] * num_sites)
        members = rng.permutation(members)
        cuts = (np.cumsum(proportions)[:-1] * len(members)).astype(int)
        for site, chunk in enumerate(np.split(members, cuts)):
            parts[site].extend(chunk.tolist())
    return tuple(np.array(sorted(p), dtype=np.int64) for p in parts)
