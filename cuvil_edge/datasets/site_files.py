"""A site's own records, read from the files its YAML's ``data`` section names.

Three sources: ``npz`` (arrays ``x`` and ``y``), ``csv`` (named feature and label columns) and
``image-folder`` (one sub-folder per class of PNG/JPEG files, resized to the model's input). Every
source is checked against the model the package carries: the records' shape against its input, the
labels against its number of classes, and no NaN or infinite value, no empty class, no empty file.
Each failure is one :class:`~cuvil_edge.errors.DataError` naming the file and the key to fix.

The agent reads these on its own device; the records never leave it. Decoded image folders are kept
in the agent's data cache (an ``.npz`` keyed by the folder's file list, sizes and modification
times, and the model input), so a round does not decode every image again.

**Image files are untrusted input.** Whoever can drop a file into a class folder
must not be able to make the agent run other decoders, exhaust its memory, or read files elsewhere:

- Only Pillow's PNG and JPEG decoders are tried (``Image.open(..., formats=("PNG", "JPEG"))``),
  whatever the suffix says: a BMP, TIFF or EPS (which would run Ghostscript) named ``.png`` is refused.
- An image may declare at most :func:`pixel_cap` pixels, checked from its header before any pixel is
  decoded: :data:`PIXELS_PER_INPUT_PIXEL` times the model input's height x width (16x its side; a
  bigger downscale throws away over 99.6% of the pixels, so such photos belong downscaled before
  they reach the device), but at least :data:`MIN_PIXEL_CAP` (a 24-megapixel, 6000 x 4000 camera
  photo is ordinary data for any model) and at most :data:`MAX_PIXEL_CAP` (Pillow's own default
  bomb threshold, kept whatever ``PIL.Image.MAX_IMAGE_PIXELS`` is set to). Pillow's
  ``DecompressionBombError`` and ``DecompressionBombWarning`` (if escalated) become DataError too.
- Symbolic links anywhere under ``data.path`` are refused, as is anything that resolves outside it;
  each image is opened relative to its folder with ``O_NOFOLLOW``, so a link swapped in after the
  listing is refused too, and only regular files are read (a FIFO cannot stall the agent).

A DataError names the local file and the fix; it never states what the image holds or declares.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
import stat
import zipfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.site import DataSection
from cuvil_edge.datasets.records import Records
from cuvil_edge.datasets.split import PUBLIC_SPLIT_KEY, split_records
from cuvil_edge.errors import DataError
from cuvil_edge.extras import require
from cuvil_edge.ir.graph import Graph

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")
#: The only Pillow decoders a site's images go through.
IMAGE_FORMATS = ("PNG", "JPEG")
#: An image may have this many times the model input's pixels (16x its width and height) ...
PIXELS_PER_INPUT_PIXEL = 256
#: ... but at least a 24-megapixel camera photo's (6000 x 4000) ...
MIN_PIXEL_CAP = 6000 * 4000
#: ... and never more than Pillow's default ``MAX_IMAGE_PIXELS`` (about 0.25 GiB as 24-bit RGB).
MAX_PIXEL_CAP = 89_478_485
#: Part of the image cache key: entries decoded under older rules are never served again.
_IMAGE_CACHE_VERSION = 2


def model_io(graph: Graph) -> tuple[tuple[int, ...], int]:
    """(one record's shape, number of classes) from the model's input and output.

    Raises:
        DataError: the model does not take one fixed-shape float input and give one score per class.
    """
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise DataError("site data needs a model with one input and one output")
    shape, out = graph.inputs[0].type.shape, graph.outputs[0].type.shape
    record = tuple(shape[1:])
    if not shape or any(not isinstance(d, int) for d in record) or not out or not isinstance(out[-1], int):
        raise DataError(
            f"site data needs a model input [batch, fixed dims] and output [batch, classes]; "
            f"this model takes {list(shape)} and gives {list(out)}"
        )
    return tuple(int(d) for d in record), int(out[-1])


def load_site_data(
    data: DataSection, graph: Graph, cache_dir: Path | None = None, *, split_key: bytes | None = None
) -> tuple[Records, Records]:
    """(train, eval) records of a site from its own files, checked against ``graph``, split by the
    per-record rule of :mod:`cuvil_edge.datasets.split` under ``split_key`` (the agent passes its
    site's secret key, :func:`~cuvil_edge.datasets.split.load_split_key`; without one, benchmarks
    get :data:`~cuvil_edge.datasets.split.PUBLIC_SPLIT_KEY`). The data cache holds records, never
    a split: the split is computed again from the records each time.

    Raises:
        DataError: the file is missing or unreadable, or its records do not fit the model (the
            message names the file and the key).
    """
    records = load_records(data, graph, cache_dir)
    return split_records(records, data.eval_fraction, key=PUBLIC_SPLIT_KEY if split_key is None else split_key)


def load_records(data: DataSection, graph: Graph, cache_dir: Path | None = None) -> Records:
    """Every record of ``data`` (a site's, or the coordinator's test set), checked against ``graph``.

    Raises:
        DataError: as :func:`load_site_data`.
    """
    record, classes = model_io(graph)
    path = Path(data.path)  # type: ignore[arg-type]  # every kind read from files has one (DataSection)
    if not path.exists():
        raise DataError(f"data.path: {path} does not exist; point it at this site's {data.kind} data")
    if data.kind == "npz":
        x, y = _npz(path)
        y = _labels(y, data.classes, path, "y")
    elif data.kind == "csv":
        x, y = _csv(path, data)
    else:
        x, y = _image_folder(path, record, data.classes, cache_dir)
    return _checked(x, y, record, classes, path, data)


def _npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as f:
            missing = [k for k in ("x", "y") if k not in f.files]
            if missing:
                raise DataError(
                    f"{path}: holds arrays {sorted(f.files)}, needs 'x' (records) and 'y' (labels); "
                    "save it with numpy.savez(path, x=..., y=...)"
                )
            return np.asarray(f["x"]), np.asarray(f["y"])
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        raise DataError(f"{path}: not an .npz of plain arrays ({e}); save one with numpy.savez") from e


def _csv(path: Path, data: DataSection) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise DataError(f"{path}: unreadable as UTF-8 CSV ({e})") from e
    if not rows:
        raise DataError(f"{path}: empty file; it needs a header row naming the columns, then one row per record")
    header = [h.strip() for h in rows[0]]
    if len(set(header)) != len(header):
        raise DataError(f"{path}: the header names a column twice; column names must be distinct")
    if data.label_column not in header:
        raise DataError(f"{path}: no column {data.label_column!r} (data.label_column); the header has {header}")
    features = data.feature_columns or [h for h in header if h != data.label_column]
    unknown = [c for c in features if c not in header]
    if unknown:
        raise DataError(f"{path}: data.feature_columns names {unknown}, not in the header {header}")
    if data.label_column in features:
        raise DataError(f"{path}: data.feature_columns lists the label column {data.label_column!r}")
    columns, label = [header.index(c) for c in features], header.index(data.label_column)
    x = np.empty((len(rows) - 1, len(columns)), np.float32)
    names = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DataError(f"{path}, line {line}: {len(row)} fields, the header has {len(header)}")
        try:
            x[line - 2] = [float(row[c]) for c in columns]
        except ValueError:
            bad = next(features[i] for i, c in enumerate(columns) if not _is_float(row[c]))
            raise DataError(
                f"{path}, line {line}: column {bad!r} holds {row[header.index(bad)]!r}, not a number"
            ) from None
        names.append(row[label].strip())
    return x, _labels(np.array(names, dtype=object), data.classes, path, data.label_column)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _labels(y: np.ndarray, classes: Sequence[str] | None, path: Path, key: str) -> np.ndarray:
    """Integer class indices: names looked up in ``classes`` when given, else integers as they are."""
    flat = np.asarray(y).reshape(-1) if np.asarray(y).ndim <= 1 else None
    if flat is None:
        raise DataError(f"{path}: labels {key!r} must be one value per record, got shape {np.shape(y)}")
    if classes is not None:
        index = {name: i for i, name in enumerate(classes)}
        unknown = sorted({str(v) for v in flat} - set(index))
        if unknown:
            raise DataError(f"{path}: labels {unknown[:5]} in {key!r} are not in data.classes {list(classes)}")
        return np.array([index[str(v)] for v in flat], np.int64)
    try:
        values = np.array([float(v) for v in flat], np.float64)
    except (TypeError, ValueError):
        raise DataError(
            f"{path}: labels in {key!r} are names, not class indices; list them in data.classes "
            "(whose order gives the indices)"
        ) from None
    if not np.all(np.isfinite(values)) or np.any(values != np.round(values)):
        bad = values[~np.isfinite(values) | (values != np.round(values))][0]
        raise DataError(f"{path}: label {bad} in {key!r} is not a whole number; labels are class indices")
    return values.astype(np.int64)


def _checked(
    x: np.ndarray, y: np.ndarray, record: tuple[int, ...], classes: int, path: Path, data: DataSection
) -> Records:
    if len(y) == 0:
        raise DataError(f"{path}: holds no record; a site needs at least one to train")
    if x.shape[1:] != record and x.ndim >= 1 and math.prod(x.shape[1:]) == math.prod(record):
        x = x.reshape((len(x), *record))  # flat features for a model that takes them shaped
    if x.shape[1:] != record or len(x) != len(y):
        raise DataError(
            f"{path}: records have shape {tuple(x.shape[1:])} ({len(x)} records, {len(y)} labels), "
            f"the model takes {record} per record; fix the data or data.feature_columns"
        )
    if not np.issubdtype(x.dtype, np.number):
        raise DataError(f"{path}: records are {x.dtype}, not numbers")
    x = np.ascontiguousarray(x, dtype=np.float32)
    bad = np.flatnonzero(~np.isfinite(x).reshape(len(x), -1).all(axis=1))
    if bad.size:
        raise DataError(
            f"{path}: record {int(bad[0])} holds NaN or an infinite value "
            f"({bad.size} such records); remove or impute them"
        )
    out = np.flatnonzero((y < 0) | (y >= classes))
    if out.size:
        raise DataError(
            f"{path}: label {int(y[out[0]])} of record {int(out[0])} is out of range; the model has "
            f"{classes} classes (0..{classes - 1})"
        )
    if data.classes is not None and len(data.classes) > classes:
        raise DataError(f"{path}: data.classes lists {len(data.classes)} classes, the model has {classes}")
    return Records(x, y.astype(np.int64))


# --- image folders ---------------------------------------------------------------------------
def _image_folder(
    root: Path, record: tuple[int, ...], classes: Sequence[str] | None, cache_dir: Path | None
) -> tuple[np.ndarray, np.ndarray]:
    if not root.is_dir():
        raise DataError(f"data.path: {root} is not a folder; kind image-folder needs one sub-folder per class")
    if len(record) != 3 or record[0] not in (1, 3):
        raise DataError(
            f"{root}: image folders need a model input [batch, 1 or 3 channels, height, width]; "
            f"this model takes records of shape {record}"
        )
    root = root.resolve()
    folders = sorted(p.name for p in _entries(root, root) if p.is_dir())
    names = list(classes) if classes is not None else folders
    missing = [c for c in names if c not in folders]
    if missing:
        raise DataError(f"{root}: no sub-folder for data.classes {missing}")
    extra = [f for f in folders if f not in names]
    if extra:
        raise DataError(f"{root}: sub-folders {extra} are not in data.classes {names}")
    files: list[tuple[Path, int]] = []
    for label, name in enumerate(names):
        found = sorted(_entries(root / name, root))
        others = [
            p.name for p in found if p.suffix.lower() not in IMAGE_SUFFIXES or not stat.S_ISREG(p.lstat().st_mode)
        ]
        if others:
            raise DataError(f"{root / name}: {others[:3]} are not PNG/JPEG files; a class folder holds images only")
        if not found:
            raise DataError(f"{root / name}: class {name!r} has no image; every class folder needs at least one")
        files.extend((p, label) for p in found)
    listing = [(str(p), p.lstat().st_size, p.lstat().st_mtime_ns, label) for p, label in files]
    key = hashlib.sha256(repr((_IMAGE_CACHE_VERSION, record, listing)).encode()).hexdigest()[:24]
    cached = None if cache_dir is None else Path(cache_dir) / f"images-{key}.npz"
    if cached is not None and cached.exists():
        try:
            with np.load(cached, allow_pickle=False) as f:
                return f["x"], f["y"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass  # torn or damaged: decode again
    x = np.stack([_image(root, p, record) for p, _ in files])
    y = np.array([label for _, label in files], np.int64)
    if cached is not None:
        buffer = io.BytesIO()
        np.savez(buffer, x=x, y=y)
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cached, buffer.getvalue())
        except OSError:
            pass  # a cache only
    return x, y


def pixel_cap(record: tuple[int, ...]) -> int:
    """The most pixels an image may declare for a model taking ``record`` ([channels, height, width])."""
    return min(MAX_PIXEL_CAP, max(MIN_PIXEL_CAP, PIXELS_PER_INPUT_PIXEL * record[1] * record[2]))


def _entries(folder: Path, root: Path) -> list[Path]:
    """The visible entries of ``folder`` (under ``root``, the resolved ``data.path``).

    Raises:
        DataError: one is a symbolic link, or resolves outside ``root``.
    """
    entries = [p for p in folder.iterdir() if not p.name.startswith(".")]
    for p in entries:
        if p.is_symlink():
            raise DataError(
                f"{p}: a symbolic link; the files of an image folder must be in it (a link can make "
                f"the agent read files outside data.path {root}); copy the file or folder in instead"
            )
        if not p.resolve().is_relative_to(root):
            raise DataError(f"{p}: resolves to outside data.path {root}; keep the site's images inside it")
    return entries


def _open_image_file(root: Path, path: Path):
    """``path`` (``root/<class>/<file>``) opened for reading without following any link below ``root``.

    Raises:
        DataError: the class folder or the file is (now) a link, or not a regular file.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            folder_fd = os.open(path.parent.name, flags | os.O_DIRECTORY, dir_fd=root_fd)
            try:
                fd = os.open(path.name, flags | os.O_NONBLOCK, dir_fd=folder_fd)
            finally:
                os.close(folder_fd)
        finally:
            os.close(root_fd)
    except OSError as e:
        raise DataError(
            f"{path}: cannot be opened as a plain file inside data.path {root} ({e.strerror}); "
            "image folders hold their own files, no links"
        ) from e
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DataError(f"{path}: not a regular file; a class folder holds PNG/JPEG files only")
    return os.fdopen(fd, "rb")


def _image(root: Path, path: Path, record: tuple[int, ...]) -> np.ndarray:
    """One image as float32 [channels, height, width] in [0, 1], resized to the model's input.

    Raises:
        DataError: not a PNG or JPEG, more pixels than :func:`pixel_cap`, unreadable, or a link.
    """
    require(("PIL",), "image-folder site data needs pillow", "images")
    from PIL import Image, UnidentifiedImageError

    channels, height, width = record
    cap = pixel_cap(record)
    with _open_image_file(root, path) as f:
        try:
            with Image.open(f, formats=IMAGE_FORMATS) as image:
                if image.width * image.height > cap:  # from the header: nothing decoded yet
                    raise DataError(_too_many_pixels(path, record, cap))
                scaled = image.convert("L" if channels == 1 else "RGB").resize(
                    (width, height), Image.Resampling.BILINEAR
                )
                pixels = np.asarray(scaled, dtype=np.float32) / 255.0
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise DataError(_too_many_pixels(path, record, cap)) from e
        except UnidentifiedImageError as e:
            raise DataError(
                f"{path}: not a readable PNG/JPEG image (site images are decoded as PNG or JPEG "
                "only, whatever the suffix says); convert it to PNG or JPEG, or remove it"
            ) from e
        except (OSError, ValueError) as e:
            raise DataError(f"{path}: not a readable PNG/JPEG image ({e}); replace or remove it") from e
    return pixels[None] if channels == 1 else pixels.transpose(2, 0, 1)


def _too_many_pixels(path: Path, record: tuple[int, ...], cap: int) -> str:
    return (
        f"{path}: declares more than {cap} pixels, the cap for this model's {record[1]}x{record[2]} input "
        f"({PIXELS_PER_INPUT_PIXEL}x its pixels, at least {MIN_PIXEL_CAP}, at most {MAX_PIXEL_CAP}); refused "
        "before decoding (a decompression bomb, or far larger than the model needs): downscale it or remove it"
    )
