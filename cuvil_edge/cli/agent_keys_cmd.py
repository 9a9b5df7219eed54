"""`cuvil-edge agent keys ...`: the site's own sealing key pair (PACKAGE_SPEC §9).

Mounted by the agent command group: ``agent_app.add_typer(agent_keys_app, name="keys")``.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

agent_keys_app = typer.Typer(no_args_is_help=True, help="The site's sealing key pair (generated on the device).")
console = Console()


@agent_keys_app.callback()
def _group() -> None:
    """The site's sealing key pair (generated on the device)."""


@agent_keys_app.command("init")
def agent_keys_init(directory: Path = typer.Option(Path(".cuvil") / "agent" / "keys", "--dir",
                                                   help="where to write seal.key and seal.pub (the state dir's keys/)"),
                    force: bool = typer.Option(False, help="replace an existing key pair")) -> None:
    """Generate this site's X25519 sealing key pair; only seal.pub leaves the device."""
    from cuvil_edge.errors import KeyFileError
    from cuvil_edge.ir_serialize.sealing import generate_seal_keypair, save_seal_keys, seal_key_id

    if not force and (directory / "seal.key").exists():
        raise KeyFileError(f"{directory}/seal.key exists; use --force to replace it (packages sealed for the old "
                           "key can no longer be opened)")
    private, public = generate_seal_keypair()
    key_path, pub_path = save_seal_keys(private, directory)
    console.print(f"sealing key: {key_path} (never leaves this device)\n"
                  f"public key:  {pub_path} (give it to the coordinator)\nkey id:      {seal_key_id(public)}")
