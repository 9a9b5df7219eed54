"""The IR container (the payload): PACKAGE_SPEC §5 layout, §6 header.

``encode_payload`` writes a graph; ``_decode_payload`` (verification's last step) reads one back with every
offset, length and digest checked before tensor data is viewed, and returns
initializers that are read-only views into the given buffer (no copies).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import mmap
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil_edge.errors import (
    BadShapeError,
    DeclaredLengthError,
    PackageFormatError,
    PayloadDigestError,
    RegionLayoutError,
    TrailingDataError,
    TruncatedPackageError,
    UnsupportedFormatError,
)
from cuvil_edge.ir import dtypes
from cuvil_edge.ir.graph import Graph, readonly
from cuvil_edge.ir.infer import MAX_DIM
from cuvil_edge.ir_serialize._canonical import (
    canonical_json,
    check_int,
    check_tensor_name,
    fields,
    get_int,
    get_list,
    get_str,
    parse_json,
)
from cuvil_edge.ir_serialize.graph_codec import MAX_RANK, graph_from_dict, graph_to_dict

Buffer = bytes | bytearray | memoryview | mmap.mmap

MAGIC = b"CUVLIRC\0"  # PACKAGE_SPEC §5.1
FORMAT_VERSION = 1
ALIGN = 64
#: magic, format version, reserved (0), header length.
PRELUDE = struct.Struct("<8sIIQ")
MAX_HEADER_BYTES = 16 * 2**20  # PACKAGE_SPEC §8
HEADER_KEYS = ("format", "graph", "tensors")
TENSOR_KEYS = ("name", "dtype", "shape", "offset", "length", "sha256")


@dataclass(frozen=True)
class TensorEntry:
    """One row of the tensor table (PACKAGE_SPEC §6.3); ``offset`` is relative to the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    length: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "offset": self.offset,
            "length": self.length,
            "sha256": self.sha256,
        }

    @staticmethod
    def from_dict(obj: Any, index: int) -> TensorEntry:
        """Parse and check one table row, including shape x itemsize == length.

        Raises:
            PackageFormatError: missing/unknown/mistyped field, unknown dtype, bad shape or length.
        """
        where = f"tensor table row #{index}"
        t = fields(obj, TENSOR_KEYS, where)
        dtype = get_str(t, "dtype", where)
        if dtype not in dtypes.SUPPORTED:
            raise UnsupportedFormatError(f"{where} has unsupported dtype {dtype!r:.40}")
        shape = get_list(t, "shape", where)
        if len(shape) > MAX_RANK:
            raise BadShapeError(f"{where} has rank {len(shape)}, more than {MAX_RANK}")
        dims = tuple(_dim(d, where) for d in shape)
        entry = TensorEntry(
            check_tensor_name(t["name"], f"{where} name"),
            dtype,
            dims,
            get_int(t, "offset", where),
            get_int(t, "length", where),
            _hex_digest(t["sha256"], where),
        )
        expected = math.prod(dims) * dtypes.itemsize(dtype)  # python ints: no overflow
        if expected != entry.length:
            raise BadShapeError(
                f"{where} ({entry.name!r}): shape {list(dims)} of {dtype} needs {expected} bytes, "
                f"length says {entry.length}"
            )
        return entry


def _dim(value: Any, where: str) -> int:
    try:
        return check_int(value, f"{where} dim", 0, MAX_DIM)
    except PackageFormatError as e:
        raise BadShapeError(str(e)) from e


def _hex_digest(value: Any, where: str) -> str:
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise PackageFormatError(f"{where} field 'sha256' must be 64 lowercase hex digits")
    return value


def align(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`ALIGN`."""
    return -(-n // ALIGN) * ALIGN


def encode_payload(graph: Graph) -> bytes:
    """The container bytes for ``graph`` (PACKAGE_SPEC §5).

    Raises:
        PackageFormatError: the graph cannot be serialized (tensor attributes, NaN attributes).
    """
    entries: list[TensorEntry] = []
    blobs: list[bytes] = []
    cursor = 0
    for name in sorted(graph.initializers):
        array = graph.initializers[name]
        little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
        blob = little.tobytes()
        entries.append(
            TensorEntry(
                name,
                dtypes.from_numpy(array.dtype),
                tuple(int(d) for d in array.shape),
                cursor,
                len(blob),
                hashlib.sha256(blob).hexdigest(),
            )
        )
        blobs.append(blob)
        cursor = align(cursor + len(blob))
    graph_dict = graph_to_dict(graph)
    # The writer applies the reader's checks (names, attributes, types), so a graph agents would
    # refuse fails here, on the coordinator, with the reader's message.
    graph_from_dict(
        parse_json(canonical_json(graph_dict, "payload graph"), "payload graph"),
        {name: graph.initializers[name] for name in sorted(graph.initializers)},
    )
    header = canonical_json(
        {"format": FORMAT_VERSION, "graph": graph_dict, "tensors": [e.to_dict() for e in entries]}, "payload header"
    )
    data_start = align(PRELUDE.size + len(header))
    out = bytearray(data_start + cursor)
    PRELUDE.pack_into(out, 0, MAGIC, FORMAT_VERSION, 0, len(header))
    out[PRELUDE.size : PRELUDE.size + len(header)] = header
    for entry, blob in zip(entries, blobs, strict=True):
        out[data_start + entry.offset : data_start + entry.offset + entry.length] = blob
    return bytes(out)


def byte_view(buffer: Buffer) -> memoryview:
    """A flat unsigned-byte memoryview of ``buffer`` (no copy).

    Raises:
        PackageFormatError: the buffer is not contiguous.
    """
    view = memoryview(buffer)
    if view.format != "B" or view.ndim != 1:
        try:
            view = view.cast("B")
        except TypeError as e:
            raise PackageFormatError(f"the payload buffer is not a contiguous byte buffer ({e})") from e
    return view


def _decode_payload(buffer: Buffer, *, max_header_bytes: int = MAX_HEADER_BYTES, check_digests: bool = True) -> Graph:
    """Read a container; initializers are read-only views into ``buffer``.

    Every structural check (PACKAGE_SPEC §6.4) runs before tensor data is viewed.

    Raises:
        PackageSizeError: the header length exceeds its cap or the buffer; the buffer is truncated.
        PackageFormatError: bad magic/version, header JSON or schema, layout or padding.
        PayloadDigestError: a tensor's bytes do not match its sha256 (``check_digests``).
    """
    view = byte_view(buffer)
    layout = read_layout(view, max_header_bytes=max_header_bytes)
    arrays = {e.name: _tensor_view(view, layout.data_start, e, check_digests) for e in layout.entries}
    return graph_from_dict(layout.header["graph"], arrays)


@dataclass(frozen=True)
class Layout:
    """The checked structure of a container (PACKAGE_SPEC §6.4), before any tensor is viewed."""

    header: Any
    header_end: int
    data_start: int
    entries: list[TensorEntry]


def read_layout(view: memoryview, *, max_header_bytes: int = MAX_HEADER_BYTES) -> Layout:
    """Prelude, header schema, region layout and zero padding of a container (no digests, no graph).

    Raises:
        PackageSizeError / PackageFormatError (leaf types): see :func:`_decode_payload`.
    """
    header_len = _read_prelude(view, max_header_bytes)
    header_end = PRELUDE.size + header_len
    header = fields(parse_json(view[PRELUDE.size : header_end], "payload header"), HEADER_KEYS, "payload header")
    if get_int(header, "format", "payload header") != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"payload header format {header['format']} is not supported (this reader: {FORMAT_VERSION})"
        )
    entries = [TensorEntry.from_dict(row, i) for i, row in enumerate(get_list(header, "tensors", "payload header"))]
    names = [e.name for e in entries]
    if any(a >= b for a, b in zip(names, names[1:], strict=False)):
        raise PackageFormatError("the tensor table must be sorted by name without duplicates (PACKAGE_SPEC §6.3)")
    data_start = align(header_end)
    _check_layout(entries, data_start, len(view))
    _check_padding(view, entries, header_end, data_start)
    return Layout(header, header_end, data_start, entries)


def _read_prelude(view: memoryview, max_header_bytes: int) -> int:
    if len(view) < PRELUDE.size:
        raise TruncatedPackageError(f"the payload is {len(view)} bytes, shorter than its {PRELUDE.size}-byte prelude")
    magic, version, reserved, header_len = PRELUDE.unpack_from(view, 0)
    if magic != MAGIC:
        raise PackageFormatError(f"the payload does not start with the container magic {MAGIC!r} (got {magic!r})")
    if version != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"container format version {version} is not supported (this reader: {FORMAT_VERSION})"
        )
    if reserved != 0:
        raise PackageFormatError("the container prelude's reserved field must be 0")
    if header_len > max_header_bytes:
        raise DeclaredLengthError(
            f"the payload header declares {header_len} bytes, over the {max_header_bytes}-byte cap"
        )
    if header_len > len(view) - PRELUDE.size:
        raise DeclaredLengthError(
            f"the payload header declares {header_len} bytes but only {len(view) - PRELUDE.size} follow"
        )
    return header_len


def _check_layout(entries: list[TensorEntry], data_start: int, total: int) -> None:
    """Regions in table order, 64-aligned, not overlapping, no gaps, inside the buffer (§6.4)."""
    end = 0
    for e in entries:
        if e.offset % ALIGN:
            raise RegionLayoutError(f"tensor {e.name!r} starts at offset {e.offset}, not a multiple of {ALIGN}")
        if e.offset < end:
            raise RegionLayoutError(
                f"tensor {e.name!r} at offset {e.offset} overlaps the previous region (ends at {end})"
            )
        if e.offset != align(end):
            raise RegionLayoutError(f"tensor {e.name!r} at offset {e.offset} leaves a gap; expected {align(end)}")
        end = e.offset + e.length
        if data_start + end > total:
            raise TruncatedPackageError(
                f"tensor {e.name!r} ends at byte {data_start + end}, past the payload end ({total})"
            )
    expected = data_start + align(end)
    if total < expected:
        raise TruncatedPackageError(f"the payload is {total} bytes, its layout needs {expected}; it is truncated")
    if total > expected:
        raise TrailingDataError(
            f"the payload has {total - expected} bytes after its last region; trailing data is not allowed"
        )


def _check_padding(view: memoryview, entries: list[TensorEntry], header_end: int, data_start: int) -> None:
    gaps = [(header_end, data_start)]
    for e, nxt in zip(entries, entries[1:] + [None], strict=False):  # no entries: [None] alone, no pair
        stop = data_start + (nxt.offset if nxt else align(e.offset + e.length))
        gaps.append((data_start + e.offset + e.length, stop))
    for start, stop in gaps:
        if any(view[start:stop]):
            raise RegionLayoutError(f"padding bytes {start}..{stop} are not all zero")


def _tensor_view(view: memoryview, data_start: int, e: TensorEntry, check_digest: bool) -> np.ndarray:
    start = data_start + e.offset
    region = view[start : start + e.length]
    if check_digest and not hmac.compare_digest(hashlib.sha256(region).hexdigest(), e.sha256):
        raise PayloadDigestError(f"tensor {e.name!r} does not match its sha256 in the payload header")
    dtype = dtypes.to_numpy(e.dtype).newbyteorder("<")
    array = np.frombuffer(view, dtype=dtype, count=e.length // dtype.itemsize, offset=start).reshape(e.shape)
    if e.dtype == "bool" and e.length and int(np.frombuffer(region, dtype=np.uint8).max()) > 1:
        raise PackageFormatError(f"bool tensor {e.name!r} holds bytes other than 0 and 1")
    return readonly(array)
