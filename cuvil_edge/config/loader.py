"""Strict YAML loading into pydantic models, with one-line errors.

Every problem becomes a :class:`~cuvil_edge.errors.ConfigError` whose message
names the file, the key path and what is expected, so the CLI can print it as
one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

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


def describe_validation_error(path: Path, error: ValidationError) -> str:
    """One line: file, dotted key, what was expected."""
    first = error.errors()[0]
    key = ".".join(str(p) for p in first["loc"]) or "(top level)"
    kind = first["type"]
    if kind == "extra_forbidden":
        what = "unknown key; remove it or check its spelling"
    elif kind == "missing":
        what = "missing required key"
    else:
        what = f"{first['msg']} (got {first.get('input')!r})"
    more = f" (+{error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{path}: {key}: {what}{more}"


def load_model(path: Path, model: type[M]) -> M:
    """Read ``path`` and validate it as ``model``.

    Raises:
        ConfigError: see :func:`read_yaml`, or a validation failure.
    """
    data = read_yaml(path)
    try:
        return model.model_validate(data, context={"base_dir": path.parent})
    except ValidationError as e:
        raise ConfigError(describe_validation_error(path, e)) from e
    except ConfigError as e:  # raised by validators that check referenced files or targets
        raise ConfigError(f"{path}: {e}") from e
