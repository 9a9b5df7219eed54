"""The public facts a site YAML states about its records (kind, one record's shape, the classes),
read from the records themselves on the device, so that `cuvil-edge agent new-site` can write
them. Nothing here leaves the device: the facts go into the device's own site file, and they are
facts the model already fixes (its input shape and its number of outputs)."""

from __future__ import annotations

import csv
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cuvil_edge.config.writers import DataFacts
from cuvil_edge.errors import DataError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def describe_records(
    path: Path,
    *,
    label_column: str | None = None,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
) -> DataFacts:
    """The ``data`` facts of the records at ``path``: an ``.npz`` (arrays ``x`` and ``y``), a
    ``.csv`` (needs ``label_column``) or a folder of per-class image folders (needs
    ``input_shape``, the model's record shape). ``input_shape`` and ``num_classes`` override
    what the records suggest (a model may have classes no record of this site holds).

    Raises:
        DataError: the path is missing or not one of the three kinds, or a fact cannot be read.
    """
    path = Path(path)
    shape = tuple(int(d) for d in input_shape) if input_shape else None
    if path.is_dir():
        classes = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not classes:
            raise DataError(f"{path}: a folder of images needs one sub-folder per class, holding PNG or JPEG files")
        if shape is None:
            raise DataError(f"{path}: images are resized to the model's input; give --input-shape C,H,W (e.g. 3,32,32)")
        return DataFacts("image-folder", path, shape, num_classes, tuple(classes))
    if not path.is_file():
        raise DataError(f"{path} does not exist; give this site's records: an .npz, a .csv or a folder of images")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        x_shape, labels = _npz_facts(path)
        return _with_labels(DataFacts("npz", path, shape or x_shape), labels, num_classes, path)
    if suffix == ".csv":
        if not label_column:
            raise DataError(f"{path}: say which column holds each record's class: --label-column NAME")
        header, labels = _csv_facts(path, label_column)
        return _with_labels(
            DataFacts("csv", path, shape or (len(header) - 1,), label_column=label_column), labels, num_classes, path
        )
    raise DataError(f"{path}: records must be an .npz (arrays x, y), a .csv or a folder of images, not {suffix!r}")


def _npz_facts(path: Path) -> tuple[tuple[int, ...], np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            if "x" not in f.files or "y" not in f.files:
                raise DataError(
                    f"{path}: holds arrays {sorted(f.files)}, needs 'x' (records) and 'y' (labels); "
                    "save it with numpy.savez(path, x=..., y=...)"
                )
            x, y = f["x"], f["y"]
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"{path}: not an .npz of plain arrays ({e}); save one with numpy.savez") from e
    if x.ndim < 2 or len(x) == 0:
        raise DataError(f"{path}: x has shape {x.shape}; it needs one row per record (records along axis 0)")
    return tuple(int(d) for d in x.shape[1:]), np.asarray(y).reshape(-1)


def _csv_facts(path: Path, label_column: str) -> tuple[list[str], np.ndarray]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = csv.reader(f)
            header = [h.strip() for h in next(rows, [])]
            if label_column not in header:
                raise DataError(f"{path}: no column {label_column!r}; its header has {header[:8]}")
            where = header.index(label_column)
            labels = np.array([row[where].strip() for row in rows if len(row) > where], dtype=object)
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read it as UTF-8 CSV ({e})") from e
    return header, labels


def _with_labels(facts: DataFacts, labels: np.ndarray, num_classes: int | None, path: Path) -> DataFacts:
    """Integer labels give ``num_classes`` (the largest + 1 unless given); names give ``classes``
    (sorted, so the indices are the same on every device that holds the same names)."""
    if len(labels) == 0:
        raise DataError(f"{path}: holds no record; a site needs at least one")
    try:
        values = np.array([float(v) for v in labels])
        whole = bool(np.all(np.isfinite(values)) and np.all(values == np.round(values)) and values.min() >= 0)
    except (TypeError, ValueError):
        whole = False
    if whole:
        count = num_classes if num_classes is not None else int(values.max()) + 1
        return DataFacts(facts.kind, facts.path, facts.input_shape, count, label_column=facts.label_column)
    names = tuple(sorted({str(v) for v in labels}))
    return DataFacts(facts.kind, facts.path, facts.input_shape, num_classes, names, facts.label_column)
