"""`cuvil-edge agent ...`: commands that run on a site's device."""

from __future__ import annotations

import typer

agent_app = typer.Typer(no_args_is_help=True, help="Agent-side commands (run on the site's device).")
