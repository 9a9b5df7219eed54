"""`cuvil-edge privacy ...`: a site's privacy budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table

privacy_app = typer.Typer(no_args_is_help=True, help="Privacy budgets and ledgers.")
console = Console()


@privacy_app.command("status")
def status(site: Path = typer.Option(..., "--site", help="site YAML"),
           state_dir: Optional[Path] = typer.Option(None, "--state-dir",
                                                    help="the agent's state directory (default: the site's "
                                                         "agent.state_dir)")) -> None:
    """Show the site's ε spent and remaining, and its ledger per round."""
    from cuvil_edge.config.site import load_site
    from cuvil_edge.errors import ConfigError
    from cuvil_edge.privacy import PrivacyLedger
    from cuvil_edge.privacy.ledger import LEDGER_FILENAME

    config = load_site(site)
    folder = state_dir or config.agent.state_dir
    if folder is None:
        raise ConfigError(f"{site}: agent.state_dir is not set; pass --state-dir DIR (the agent's state directory)")
    path = Path(folder) / LEDGER_FILENAME
    p = config.privacy
    if not path.exists():
        console.print(f"site {config.site}: no ledger at {path}; nothing spent yet "
                      f"(budget ε={p.epsilon_budget:g}, δ={p.delta:g}). Check --state-dir if this is unexpected.")
        return
    with PrivacyLedger(path, site=config.site, epsilon_budget=p.epsilon_budget, delta=p.delta) as ledger:
        spent, remaining, rounds = ledger.spent(), ledger.remaining(), ledger.rounds()
    console.print(f"site [bold]{config.site}[/bold]  ledger {path}")
    console.print(f"ε spent {spent:.4f} of {p.epsilon_budget:g} (δ={p.delta:g}), remaining {remaining:.4f}")
    table = Table("round", "mechanism", "parameters", "event ε", "status", "key", "reserved (UTC)",
                  "total ε after round", title="ledger")
    for entry in rounds:
        for i, row in enumerate(entry["rows"]):
            last = i == len(entry["rows"]) - 1
            table.add_row("-" if entry["round"] is None else str(entry["round"]), row["mechanism"],
                          _parameters(row), f"{row['epsilon']:.4f}", row["status"], row["key"],
                          row["created_at"][:19].replace("T", " "),
                          f"{entry['spent_after']:.4f}" if last else "", end_section=last)
    console.print(table)


def _parameters(row: dict[str, Any]) -> str:
    if row["mechanism"] == "dpsgd":
        return f"σ={row['noise_multiplier']:.4g} q={row['sample_rate']:.4g} steps={row['steps']}"
    if row["mechanism"] == "gaussian":
        return f"σ={row['noise_std']:.4g} Δ₂={row['sensitivity']:.4g}"
    return f"ε={row['epsilon']:.4g}"
