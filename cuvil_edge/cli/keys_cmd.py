"""`cuvil-edge keys ...`: the coordinator's signing keys."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

DEFAULT_KEYS = Path(".cuvil") / "keys"

keys_app = typer.Typer(no_args_is_help=True, help="Coordinator signing keys.")
console = Console()


@keys_app.command("init")
def keys_init(directory: Path = typer.Option(DEFAULT_KEYS, "--dir", help="where to write the key pair"),
              force: bool = typer.Option(False, help="replace existing keys")) -> None:
    """Create the coordinator's Ed25519 signing key pair."""
    from cuvil_edge.coordinator.keys import init_keys

    private, public = init_keys(directory, force=force)
    console.print(f"private key: {private} (keep it secret)\npublic key:  {public} (pin it on every agent)")
