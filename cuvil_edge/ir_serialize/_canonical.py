"""Canonical JSON (PACKAGE_SPEC §1.2) and strict field readers shared by the schemas.

Writing: sorted keys, separators ``(",", ":")``, UTF-8 without ASCII escaping,
NaN/Infinity refused.  Reading: valid UTF-8, no duplicate keys, no NaN or
Infinity, nothing after the value, and (by default) the bytes must be exactly
the canonical encoding of what they decode to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from cuvil_edge.errors import BadNameError, DuplicateKeyError, PackageFormatError, UnsupportedFormatError

#: Largest integer any schema field may hold (fits a signed 64-bit int everywhere).
MAX_INT = 2**63 - 1


def canonical_json(obj: Any, what: str) -> bytes:
    """The canonical encoding of ``obj`` (PACKAGE_SPEC §1.2).

    Raises:
        PackageFormatError: ``obj`` holds NaN/Infinity, lone surrogates or non-JSON types.
    """
    try:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError) as e:
        raise PackageFormatError(f"{what} cannot be written as canonical JSON: {e}") from e


def _pairs_hook(what: str):
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise DuplicateKeyError(f"{what} has the key {key!r} twice; duplicate JSON keys are not allowed")
            result[key] = value
        return result

    return hook


def _reject_constant(name: str) -> Any:
    raise PackageFormatError(f"JSON constant {name} is not allowed (PACKAGE_SPEC §1.2)")


#: Deepest nesting of arrays/objects any document may have (PACKAGE_SPEC §1.2).  Ours need 8;
#: the cap keeps every recursive reader and writer (json, canonical re-encoding) far from
#: Python's recursion limit.
MAX_JSON_DEPTH = 32
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _check_depth(text: str, what: str) -> None:
    """Refuse nesting deeper than :data:`MAX_JSON_DEPTH` before any recursive parser sees it.

    Raises:
        PackageFormatError: the document nests too deeply.
    """
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    if len(brackets) <= MAX_JSON_DEPTH:
        return
    steps = np.frombuffer(brackets.encode("ascii"), dtype=np.uint8)
    depth = np.cumsum(np.where((steps == ord("[")) | (steps == ord("{")), 1, -1), dtype=np.int64)
    if int(depth.max()) > MAX_JSON_DEPTH:
        raise PackageFormatError(
            f"{what} nests arrays/objects {int(depth.max())} deep, more than {MAX_JSON_DEPTH} (PACKAGE_SPEC §1.2)"
        )


def parse_json(data: bytes | memoryview, what: str, *, canonical: bool = True) -> Any:
    """Strictly parse JSON bytes (PACKAGE_SPEC §1.2).

    Raises:
        PackageFormatError: invalid UTF-8 or JSON, trailing data, duplicate keys,
            NaN/Infinity, or (``canonical``) bytes that are not the canonical form.
    """
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as e:
        raise PackageFormatError(f"{what} is not valid UTF-8 ({e})") from e
    _check_depth(text, what)
    try:
        obj = json.loads(text, object_pairs_hook=_pairs_hook(what), parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise PackageFormatError(
            f"{what} is not valid JSON: {e.msg} at byte {e.pos} (garbage or trailing data?)"
        ) from e
    except RecursionError as e:
        raise PackageFormatError(f"{what} nests too deeply") from e
    except ValueError as e:
        if isinstance(e, PackageFormatError):
            raise
        raise PackageFormatError(f"{what} is not acceptable JSON: {e}") from e
    if canonical and canonical_json(obj, what) != bytes(data):
        raise PackageFormatError(
            f"{what} is valid JSON but not in canonical form (sorted keys, no spaces, UTF-8); PACKAGE_SPEC §1.2"
        )
    return obj


def fields(obj: Any, required: Iterable[str], where: str) -> Mapping[str, Any]:
    """``obj`` as a mapping with exactly the ``required`` keys.

    Raises:
        PackageFormatError: not an object, or a key is missing or unknown.
    """
    if not isinstance(obj, dict):
        raise PackageFormatError(f"{where} must be a JSON object, got {type(obj).__name__}")
    want = set(required)
    missing, unknown = sorted(want - obj.keys()), sorted(obj.keys() - want)
    if missing:
        raise PackageFormatError(f"{where} lacks required field(s) {missing}")
    if unknown:
        raise UnsupportedFormatError(f"{where} has unknown field(s) {unknown}; this reader rejects anything unknown")
    return obj


def get_int(obj: Mapping[str, Any], key: str, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """An integer field in ``lo..hi`` (booleans are not integers here).

    Raises:
        PackageFormatError: wrong type or out of range.
    """
    return check_int(obj[key], f"{where} field {key!r}", lo, hi)


def check_int(value: Any, where: str, lo: int = 0, hi: int = MAX_INT) -> int:
    """``value`` if it is an int (not bool) in ``lo..hi``.

    Raises:
        PackageFormatError: wrong type or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise PackageFormatError(f"{where} must be an integer, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise PackageFormatError(f"{where} is {value}, outside {lo}..{hi}")
    return value


def get_str(obj: Mapping[str, Any], key: str, where: str, *, max_len: int = 4096, empty: bool = False) -> str:
    """A string field without control characters, at most ``max_len`` characters.

    Raises:
        PackageFormatError: wrong type, empty, too long or with control characters.
    """
    return check_str(obj[key], f"{where} field {key!r}", max_len=max_len, empty=empty)


#: C0 controls and DEL: no string field of a package may hold one.
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def check_str(value: Any, where: str, *, max_len: int = 4096, empty: bool = False) -> str:
    """``value`` if it is an acceptable string (see :func:`get_str`).

    Raises:
        PackageFormatError: wrong type, empty, too long or with control characters.
    """
    if not isinstance(value, str):
        raise PackageFormatError(f"{where} must be a string, got {type(value).__name__}")
    if not value and not empty:
        raise PackageFormatError(f"{where} must not be empty")
    if len(value) > max_len:
        raise PackageFormatError(f"{where} is {len(value)} characters, more than {max_len}")
    if _CONTROL.search(value):
        raise PackageFormatError(f"{where} contains control characters")
    return value


def get_list(obj: Mapping[str, Any], key: str, where: str) -> list[Any]:
    """A list field.

    Raises:
        PackageFormatError: the field is not a JSON array.
    """
    value = obj[key]
    if not isinstance(value, list):
        raise PackageFormatError(f"{where} field {key!r} must be a JSON array, got {type(value).__name__}")
    return value


#: Characters no name may hold (PACKAGE_SPEC §1.3): C0 and C1 controls and DEL; bidi embeddings,
#: overrides and isolates (they make a name display differently from what it is); the line and
#: paragraph separators; the byte-order mark; and the backslash (a Windows path separator).
_FORBIDDEN_IN_NAMES = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufeff\\\\]")
#: A leading drive letter (``C:``) turns a name into an absolute Windows path.
_DRIVE_LETTER = re.compile("[A-Za-z]:")


def _name_chars(value: Any, where: str) -> None:
    if isinstance(value, str):
        bad = _FORBIDDEN_IN_NAMES.search(value)
        if bad:
            raise BadNameError(
                f"{where} {value!r:.80} holds the forbidden character U+{ord(bad.group()):04X} "
                "(control, bidi, line separator, BOM or backslash; PACKAGE_SPEC §1.3)"
            )
        if _DRIVE_LETTER.match(value):
            raise BadNameError(f"{where} {value!r:.80} starts with a drive letter (PACKAGE_SPEC §1.3); rename it")


def check_name(value: Any, where: str, *, max_len: int = 256) -> str:
    """An identifier-like name (site, target, package): the characters of :func:`check_graph_name`
    and no ``/`` or ``..`` (PACKAGE_SPEC §1.3); such names are never used as file paths, but are
    refused anyway.

    Raises:
        BadNameError: the name holds a forbidden character or sequence.
        PackageFormatError: not a string, empty or too long.
    """
    _name_chars(value, where)
    if isinstance(value, str) and ("/" in value or ".." in value):
        raise BadNameError(f"{where} {value!r:.80} contains '/' or '..' (PACKAGE_SPEC §1.3)")
    return check_str(value, where, max_len=max_len)


def check_graph_name(value: Any, where: str, *, empty: bool = False) -> str:
    """A graph value, node or attribute name: no control (C0, C1), bidi, line-separator or BOM
    characters, no backslash, no leading drive letter (PACKAGE_SPEC §1.3).  Exporters name values
    like paths (``/fc1/Gemm_output_0``), so ``/`` is allowed here.

    Raises:
        BadNameError: the name holds a forbidden character.
        PackageFormatError: not a string, empty (unless ``empty``) or too long.
    """
    _name_chars(value, where)
    return check_str(value, where, max_len=4096, empty=empty)


def check_tensor_name(value: Any, where: str) -> str:
    """A tensor (initializer) name: a graph name without a leading ``/`` or a ``..`` path
    component (PACKAGE_SPEC §1.3).

    Raises:
        BadNameError: the name holds a forbidden character or looks like a path.
        PackageFormatError: not a string, empty or too long.
    """
    _name_chars(value, where)
    if isinstance(value, str) and (value.startswith("/") or ".." in value.split("/")):
        raise BadNameError(f"{where} {value!r:.80} looks like a path (leading '/' or a '..' part)")
    return check_str(value, where, max_len=4096)


def hex_digest(value: Any, where: str) -> str:
    """``value`` if it is 64 lowercase hex digits.

    Raises:
        PackageFormatError: anything else.
    """
    if not (isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)):
        raise PackageFormatError(f"{where} must be 64 lowercase hex digits")
    return value


def b64decode_strict(value: Any, where: str, max_bytes: int) -> bytes:
    """Standard base64 with padding, in its one canonical spelling.

    Raises:
        DeclaredLengthError: the decoded bytes would exceed ``max_bytes`` (checked before decoding).
        PackageFormatError: not a string or not canonical base64.
    """
    import base64
    import binascii

    from cuvil_edge.errors import DeclaredLengthError

    if not isinstance(value, str):
        raise PackageFormatError(f"{where} must be a base64 string")
    if len(value) > 4 * -(-max_bytes // 3):
        raise DeclaredLengthError(f"{where} decodes to more than {max_bytes} bytes")
    try:
        raw = base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise PackageFormatError(f"{where} is not valid base64 ({e})") from e
    if base64.b64encode(raw).decode("ascii") != value:
        raise PackageFormatError(f"{where} is not canonical base64")
    return raw


def b64encode(data: bytes) -> str:
    """Standard base64 with padding."""
    import base64

    return base64.b64encode(bytes(data)).decode("ascii")
