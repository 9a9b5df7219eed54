"""`cuvil-edge agent keys ...`: the site's own sealing key pair (PACKAGE_SPEC §9).

Mounted by the agent command group: ``agent_app.add_typer(agent_keys_app, name="keys")``.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from cuvil_edge.config.home import DEFAULT_HOME, site_state_dir

agent_keys_app = typer.Typer(no_args_is_help=True, help="The site's sealing key pair (generated on the device).")
console = Console()


@agent_keys_app.callback()
def _group() -> None:
    """The site's sealing key pair (generated on the device)."""


@agent_keys_app.command("init")
def agent_keys_init(
    site: Path | None = typer.Option(
        None, "--site", help="this site's YAML: the keys go to its state directory's keys/ (where the agent reads them)"
    ),
    directory: Path | None = typer.Option(None, "--dir", help="write the keys here instead"),
    home: Path = typer.Option(DEFAULT_HOME, "--home", help="federation home (config/home.py)"),
    force: bool = typer.Option(False, help="replace an existing key pair"),
) -> None:
    """Generate this site's X25519 sealing key pair; only seal.pub leaves the device."""
    from cuvil_edge.config import load_site
    from cuvil_edge.errors import ConfigError, KeyFileError
    from cuvil_edge.ir_serialize.sealing import generate_seal_keypair, save_seal_keys, seal_key_id

    if (site is None) == (directory is None):
        raise ConfigError("give --site SITE.yaml (keys in the site's state directory) or --dir DIR, not both")
    directory = directory or site_state_dir(load_site(site), home) / "keys"  # type: ignore[arg-type]  # site given (above)

    if not force and (directory / "seal.key").exists():
        raise KeyFileError(
            f"{directory}/seal.key exists; use --force to replace it (packages sealed for the old "
            "key can no longer be opened)"
        )
    private, public = generate_seal_keypair()
    key_path, pub_path = save_seal_keys(private, directory)
    console.print(
        f"sealing key: {key_path} (never leaves this device)\n"
        f"public key:  {pub_path} (give it to the coordinator)\nkey id:      {seal_key_id(public)}"
    )
