"""Writing a site's and a federation's YAML from facts a command knows, so no one hand-edits one.

``cuvil-edge agent new-site`` writes the device's site file from its target and its records;
``cuvil-edge coordinator federation`` writes the coordinator's federation file and one site file
per enrolled site. Each text is validated by the same loader that later reads it, before the
file is written (atomically): a written file always loads.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from cuvil_edge.atomic import atomic_write
from cuvil_edge.errors import ConfigError

#: The demo's per-site DP settings (configs/sites/*.yaml): 20 rounds and 20 evaluations at these
#: values compose to 7.98 ε under the ledger's accountant.
DEFAULT_BUDGET, DEFAULT_PER_ROUND, DEFAULT_EVAL_EPSILON = 8.0, 2.18, 0.05


@dataclass(frozen=True)
class DataFacts:
    """What a site YAML's ``data`` section says about the records (see config/site.DataSection)."""

    kind: str
    path: Path | None = None
    input_shape: tuple[int, ...] | None = None
    num_classes: int | None = None
    classes: tuple[str, ...] | None = None
    label_column: str | None = None

    def section(self, relative_to: Path) -> dict:
        """The ``data`` mapping, its path written relative to the folder of the file naming it."""
        out: dict = {"kind": self.kind}
        if self.path is not None:
            out["path"] = _relative(self.path, relative_to)
        if self.label_column is not None:
            out["label_column"] = self.label_column
        if self.classes is not None:
            out["classes"] = list(self.classes)
        if self.input_shape is not None:
            out["input_shape"] = list(self.input_shape)
        if self.num_classes is not None and self.classes is None:
            out["num_classes"] = self.num_classes
        return out


def _relative(path: Path, folder: Path) -> str:
    """``path`` as the YAML should name it: relative to ``folder`` (where the YAML lives)."""
    path, folder = Path(path).resolve(), Path(folder).resolve()
    try:
        return Path(os.path.relpath(path, folder)).as_posix()
    except ValueError:  # another drive (Windows): only an absolute path reaches it
        return path.as_posix()


class _Dumper(yaml.SafeDumper):
    """Sections as blocks, lists of scalars on one line (``input_shape: [1, 8, 8]``), as people write them."""


_Dumper.add_representer(
    list,
    lambda dumper, value: dumper.represent_sequence(
        "tag:yaml.org,2002:seq", value, flow_style=all(not isinstance(v, (list, dict)) for v in value)
    ),
)


def _dump(mapping: dict) -> str:
    return yaml.dump(mapping, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


def site_yaml(
    site: str,
    target: str,
    data: DataFacts | None,
    *,
    folder: Path,
    description: str = "",
    epsilon_budget: float = DEFAULT_BUDGET,
    epsilon_per_round: float | None = None,
    eval_epsilon: float = DEFAULT_EVAL_EPSILON,
    precision: str = "fp32",
) -> str:
    """A complete site YAML for a site whose file will live in ``folder``.

    ``epsilon_per_round`` defaults to the demo's 2.18, or the whole budget when less is left
    (a replacement device's budget is what its predecessor left, and may be below one round).
    ``data`` None: the coordinator's copy, which names no records (it holds none).
    """
    per_round = epsilon_per_round if epsilon_per_round is not None else min(DEFAULT_PER_ROUND, epsilon_budget)
    head = f"# {description or site}: written by `cuvil-edge`; every key is checked when it is read.\n" + (
        "# The device's own site file: its privacy budget, training and records are decided here.\n"
        if data is not None
        else "# The coordinator's copy: it addresses, targets and plans this site's packages. The device's\n"
        "# own site file decides its privacy, training and records.\n"
    )
    body: dict = {"site": site, "target": target, "precision": precision}
    if description:
        body["description"] = description
    body["privacy"] = {
        "epsilon_budget": float(epsilon_budget),
        "delta": 1.0e-5,
        "epsilon_per_round": float(per_round),
        "eval_epsilon": float(eval_epsilon),
    }
    body["training"] = {
        "local_epochs": 2,
        "batch_size": 32,
        "sample_rate": 0.08,
        "learning_rate": 0.15,
        "momentum": 0.0,
        "max_grad_norm": 1.0,
        "weight": 1,
    }
    if data is not None:
        body["data"] = {**data.section(folder), "eval_fraction": 0.1}
    return head + _dump(body)


def federation_yaml(
    name: str,
    model: str,
    site_files: Sequence[Path],
    *,
    folder: Path,
    rounds: int,
    min_sites: int | None = None,
    test: DataFacts | None = None,
) -> str:
    """A federation YAML (living in ``folder``) over ``site_files``, with the demo's strategy and DP."""
    body: dict = {
        "name": name,
        "rounds": int(rounds),
        "model": model if model.startswith("builtin:") else _relative(Path(model), folder),
        "sites": [_relative(p, folder) for p in site_files],
    }
    if test is not None:
        body["dataset"] = {"test": test.section(folder)}
    body["round_timeout"] = 600
    body["start_timeout"] = 300
    if min_sites is not None:
        body["min_sites"] = int(min_sites)
    body["strategy"] = {"name": "fedavgm", "server_momentum": 0.5}
    body["local_dp"] = True
    head = (
        "# Written by `cuvil-edge coordinator federation` from the sites enrolled in the home; every key\n"
        "# is checked when read (docs/DEPLOYMENT.md §5 says what each one does).\n"
    )
    return head + _dump(body)


def write_config(path: Path, text: str, loader, *, force: bool = False) -> None:
    """Validate ``text`` with ``loader`` (load_site / load_federation) as the file ``path``, then
    write it atomically; an existing file is kept unless ``force``.

    Raises:
        ConfigError: the file exists (and not ``force``), or the text does not validate.
    """
    path = Path(path)
    if path.exists() and not force:
        raise ConfigError(f"{path} exists; keep it, or pass --force to write it again")
    path.parent.mkdir(parents=True, exist_ok=True)
    probe = path.with_name(f".{path.name}.{os.getpid()}.check")
    try:
        probe.write_text(text, encoding="utf-8")
        loader(probe)  # relative paths resolve from the same folder as the real file
    finally:
        probe.unlink(missing_ok=True)
    atomic_write(path, text.encode("utf-8"), mode=0o644)
