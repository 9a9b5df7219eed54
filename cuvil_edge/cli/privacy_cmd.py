"""`cuvil-edge privacy ...`: a site's privacy budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from cuvil_edge.config.home import DEFAULT_HOME

privacy_app = typer.Typer(no_args_is_help=True, help="Privacy budgets and ledgers.")
console = Console()


def _ledger_path(site: Path, state_dir: Path | None, home: Path):
    from cuvil_edge.config.home import site_state_dir
    from cuvil_edge.config.site import load_site
    from cuvil_edge.privacy.ledger import LEDGER_FILENAME

    config = load_site(site)
    return config, Path(state_dir or site_state_dir(config, home)) / LEDGER_FILENAME


_STATE_HELP = "the agent's state directory (default: the site's agent.state_dir, else HOME/agents/<site>)"


@privacy_app.command("status")
def status(
    site: Path = typer.Option(..., "--site", help="site YAML"),
    state_dir: Path | None = typer.Option(None, "--state-dir", help=_STATE_HELP),
    home: Path = typer.Option(DEFAULT_HOME, "--home", help="federation home"),
) -> None:
    """Show the site's ε spent and remaining, and its ledger per round."""
    from cuvil_edge.privacy import PrivacyLedger

    config, path = _ledger_path(site, state_dir, home)
    p = config.privacy
    if not path.exists():
        console.print(
            f"site {config.site}: no ledger at {path}; nothing spent yet "
            f"(budget ε={p.epsilon_budget:g}, δ={p.delta:g}). Check --state-dir if this is unexpected."
        )
        return
    with PrivacyLedger(path, site=config.site, epsilon_budget=p.epsilon_budget, delta=p.delta) as ledger:
        spent, remaining, rounds = ledger.spent(), ledger.remaining(), ledger.rounds()
    console.print(f"site [bold]{config.site}[/bold]  ledger {path}")
    console.print(f"ε spent {spent:.4f} of {spent + remaining:g} (δ={p.delta:g}), remaining {remaining:.4f}")
    table = Table(
        "round",
        "mechanism",
        "parameters",
        "event ε",
        "status",
        "key",
        "reserved (UTC)",
        "total ε after round",
        title="ledger",
    )
    for entry in rounds:
        for i, row in enumerate(entry["rows"]):
            last = i == len(entry["rows"]) - 1
            table.add_row(
                "-" if entry["round"] is None else str(entry["round"]),
                row["mechanism"],
                _parameters(row),
                f"{row['epsilon']:.4f}",
                row["status"],
                row["key"],
                row["created_at"][:19].replace("T", " "),
                f"{entry['spent_after']:.4f}" if last else "",
                end_section=last,
            )
    console.print(table)


def _parameters(row: dict[str, Any]) -> str:
    if row["mechanism"] == "dpsgd":
        return f"σ={row['noise_multiplier']:.4g} q={row['sample_rate']:.4g} steps={row['steps']}"
    if row["mechanism"] == "gaussian":
        return f"σ={row['noise_std']:.4g} Δ₂={row['sensitivity']:.4g}"
    return f"ε={row['epsilon']:.4g}"


@privacy_app.command("raise-budget")
def raise_budget(
    site: Path = typer.Option(..., "--site", help="site YAML (its privacy.epsilon_budget is recorded)"),
    reason: str = typer.Option(..., "--reason", help="who approved the change and why (kept in the ledger)"),
    to: float | None = typer.Option(None, "--to", help="new total budget (default: the site YAML's)"),
    state_dir: Path | None = typer.Option(None, "--state-dir", help=_STATE_HELP),
    home: Path = typer.Option(DEFAULT_HOME, "--home", help="federation home"),
) -> None:
    """Record a new total ε budget for a site in its ledger (editing the YAML alone is refused)."""
    from cuvil_edge.errors import ConfigError
    from cuvil_edge.privacy import PrivacyLedger

    config, path = _ledger_path(site, state_dir, home)
    new = config.privacy.epsilon_budget if to is None else to
    if new > config.privacy.epsilon_budget:  # the lower of the two is enforced: the raise would not hold
        raise ConfigError(
            f"{site} sets privacy.epsilon_budget {config.privacy.epsilon_budget:g}, below --to {new:g}; "
            f"the lower of the YAML's and the ledger's budget is enforced, so set it to {new:g} "
            "in the YAML and run this again"
        )
    if not path.exists():
        raise ConfigError(f"no ledger at {path} yet; the site's first use creates it with its YAML budget")
    with PrivacyLedger(path, site=config.site, epsilon_budget=None, delta=config.privacy.delta) as ledger:
        old = ledger.recorded_budget()
        ledger.record_budget(new, reason)
    console.print(f"site {config.site}: budget {old:g} -> {new:g} recorded in {path} ({reason})")
