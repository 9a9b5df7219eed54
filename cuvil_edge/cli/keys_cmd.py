"""`cuvil-edge keys ...`: the federation's trust root and signing keys (PACKAGE_SPEC §10, §13)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

DEFAULT_KEYS = Path(".cuvil") / "keys"

keys_app = typer.Typer(no_args_is_help=True, help="Trust root (root.json) and the root, release and coordinator keys.")
console = Console()
_DIR = typer.Option(DEFAULT_KEYS, "--dir", help="the keys directory")
_DAYS = typer.Option(365, "--expires-days", min=1, help="validity of the new root.json")


@keys_app.command("init")
def keys_init(
    directory: Path = _DIR, force: bool = typer.Option(False, help="replace existing keys"), days: int = _DAYS
) -> None:
    """Create root, release and coordinator keys and root.json v1."""
    from cuvil_edge.coordinator.keys import init_keys

    private, root = init_keys(directory, force=force, validity_s=days * 86400)
    console.print(
        f"coordinator key: {private} (online, signs per-site manifests)\n"
        f"release key:     {directory / 'release.key'} (signs release statements; keep offline if you can)\n"
        f"root key:        {directory / 'root.key'} (keep offline: it signs root rotations)\n"
        f"trust root:      {root} (pin it on every agent)"
    )


@keys_app.command("rotate")
def keys_rotate(
    role: str = typer.Argument(..., help="root, release or coordinator"), directory: Path = _DIR, days: int = _DAYS
) -> None:
    """Replace ROLE's key; publishes root.json N+1 signed by the old and new root keys."""
    from cuvil_edge.coordinator.keys import rotate_key

    root = rotate_key(directory, role, validity_s=days * 86400)
    console.print(f"rotated the {role} key; root.json is now version {root.version}")


@keys_app.command("revoke")
def keys_revoke(
    keyid: str = typer.Argument(..., help="key id (or a prefix of >= 8 hex digits)"),
    directory: Path = _DIR,
    days: int = _DAYS,
) -> None:
    """Publish root.json N+1 without KEYID."""
    from cuvil_edge.coordinator.keys import revoke_key

    root = revoke_key(directory, keyid, validity_s=days * 86400)
    console.print(f"revoked {keyid}; root.json is now version {root.version}")


@keys_app.command("show")
def keys_show(directory: Path = _DIR) -> None:
    """Show root.json: version, expiry, roles and key ids."""
    from cuvil_edge.coordinator.keys import current_root

    root = current_root(directory)
    expires = datetime.fromtimestamp(root.expires, UTC)
    console.print(f"root.json version {root.version}, expires {expires:%Y-%m-%d %H:%M:%S} UTC")
    table = Table("role", "threshold", "key ids")
    for name, role in sorted(root.roles.items()):
        table.add_row(name, str(role.threshold), "\n".join(role.keyids))
    console.print(table)
