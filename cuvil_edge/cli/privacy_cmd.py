"""`cuvil-edge privacy ...`: a site's privacy budget."""

from __future__ import annotations

import typer

privacy_app = typer.Typer(no_args_is_help=True, help="Privacy budgets and ledgers.")
