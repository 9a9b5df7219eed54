"""Where durable state lives, computed in one place.

A *home* (default ``.cuvil`` in the working directory) holds the federation's keys
(``keys/``), the per-site package version counters (``versions.json``) and, for sites whose
YAML sets no ``agent.state_dir``, each site's state directory (``agents/<site>/``: trusted
root and anti-rollback state, privacy ledger, kept packages, build cache). Nothing here is
per run: training, evaluation and inference of a site all spend from the one ledger in its
state directory, across runs.
"""

from __future__ import annotations

from pathlib import Path

from cuvil_edge.config.site import SiteConfig

DEFAULT_HOME = Path(".cuvil")


def site_state_dir(site: SiteConfig, home: Path | None = None) -> Path:
    """The site's state directory: its YAML's ``agent.state_dir``, else ``<home>/agents/<site>``."""
    return site.agent.state_dir or (Path(home) if home is not None else DEFAULT_HOME) / "agents" / site.site


def keys_dir(home: Path | None = None) -> Path:
    """The federation's keys directory in ``home``."""
    return (Path(home) if home is not None else DEFAULT_HOME) / "keys"


def versions_file(home: Path | None = None) -> Path:
    """The coordinator's durable per-site package version counters in ``home``."""
    return (Path(home) if home is not None else DEFAULT_HOME) / "versions.json"
