"""Strict YAML loading into pydantic models, with one-line errors.

Every problem becomes a :class:`~cuvil_edge.errors.ConfigError` whose message
names the file, the key path and what is expected, so the CLI can print it as
one line.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin, overload

import yaml
from pydantic import BaseModel, ValidationError, ValidationInfo

from cuvil_edge.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last."""


def _no_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise ConfigError(f"line {key_node.start_mark.line + 1}: key {key!r} appears twice; keep one")
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def read_yaml(path: Path) -> dict:
    """Parse a YAML file whose top level must be a mapping.

    Raises:
        ConfigError: missing/unreadable file, YAML syntax error, duplicate key, not a mapping.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise ConfigError(f"{path}: file not found; check the path") from e
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})") from e
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}:{where}: invalid YAML ({getattr(e, 'problem', e)})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


@overload
def relative_to_file(value: str, info: ValidationInfo) -> Path: ...
@overload
def relative_to_file(value: object, info: ValidationInfo) -> object: ...
def relative_to_file(value: object, info: ValidationInfo) -> object:
    """A path a YAML file names, made absolute: ``~`` expanded, a relative path taken from the
    directory of that file (``base_dir`` in the validation context, set by :func:`load_model`),
    never from the working directory; an absolute path stays. Anything but a string is left
    for pydantic to check.
    """
    if isinstance(value, str):
        base = Path((info.context or {}).get("base_dir", "."))
        return (base / Path(value).expanduser()).resolve()
    return value


#: Most problems one error line names; the rest are counted.
MAX_SHOWN = 8


def _step(node: object, part: object) -> object:
    """The type found at one more location part below ``node`` (a type annotation), or None."""
    origin = get_origin(node)
    if origin is Annotated:
        return _step(get_args(node)[0], part)
    if origin in (Union, types.UnionType):
        members = [m for m in get_args(node) if m is not type(None)]
        if len(members) == 1:
            return _step(members[0], part)
        for member in members:  # a tagged union: pydantic puts the tag (or class name) in the location
            if (
                isinstance(member, type)
                and issubclass(member, BaseModel)
                and (
                    member.__name__ == part
                    or any(
                        part in get_args(f.annotation)
                        for f in member.model_fields.values()
                        if get_origin(f.annotation) is Literal
                    )
                )
            ):
                return member
        return None
    if origin in (list, tuple, set, frozenset):
        return get_args(node)[0] if isinstance(part, int) and get_args(node) else None
    if origin is dict:
        return get_args(node)[1] if get_args(node) else None
    if isinstance(node, type) and issubclass(node, BaseModel) and isinstance(part, str):
        field = node.model_fields.get(part)
        return None if field is None else field.annotation
    return None


def _keys_at(model: type[BaseModel] | None, loc: tuple) -> list[str]:
    """The keys the section at ``loc`` of ``model`` accepts (none when it is not a section)."""
    node: object = model
    for part in loc:
        node = _step(node, part)
    while get_origin(node) in (Annotated, Union, types.UnionType):
        members = [m for m in get_args(node) if m is not type(None)]
        node = members[0] if len(members) == 1 else None
    if isinstance(node, type) and issubclass(node, BaseModel):
        return [f.alias or name for name, f in node.model_fields.items()]
    return []


def _problem(error: Mapping[str, Any], model: type[BaseModel] | None) -> str:
    """One validation error as ``dotted.key: what``."""
    loc = tuple(error["loc"])
    key = ".".join(str(p) for p in loc) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(loc[-1]), _keys_at(model, loc[:-1]), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}?" if close else "remove it or check its spelling"
        return f"{key}: unknown key ({hint})"
    if kind == "missing":
        return f"{key}: missing required key"
    shown = repr(error.get("input"))
    shown = shown if len(shown) <= 60 else shown[:59] + "…"
    return f"{key}: {' '.join(str(error['msg']).split())} (got {shown})"


def describe_validation_error(path: Path, error: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line: the file, then every problem as ``dotted.key: what`` (unknown keys first, each
    with the closest key ``model`` accepts there; then missing keys; then wrong values), at most
    :data:`MAX_SHOWN` of them and a count of the rest."""
    rank = {"extra_forbidden": 0, "missing": 1}
    errors = sorted(error.errors(), key=lambda e: rank.get(e["type"], 2))  # stable: YAML order within a kind
    problems = [_problem(e, model) for e in errors]
    more = f"; +{len(problems) - MAX_SHOWN} more" if len(problems) > MAX_SHOWN else ""
    return f"{path}: " + "; ".join(problems[:MAX_SHOWN]) + more


def load_model(path: Path, model: type[M]) -> M:
    """Read ``path`` and validate it as ``model``.

    Raises:
        ConfigError: see :func:`read_yaml`, or a validation failure.
    """
    data = read_yaml(path)
    try:
        return model.model_validate(data, context={"base_dir": path.parent})
    except ValidationError as e:
        raise ConfigError(describe_validation_error(path, e, model)) from e
    except ConfigError as e:  # raised by validators that check referenced files or targets
        raise ConfigError(f"{path}: {e}") from e
