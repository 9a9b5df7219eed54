"""`cuvil-edge runs` and `cuvil-edge stop RUN` (coordinator side): the runs of the SuperLink that
`coordinator serve` started in the home, and stopping one."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cuvil_edge.config.home import DEFAULT_HOME

console = Console()


def runs_cmd(home: Path = typer.Option(DEFAULT_HOME, "--home", help="the coordinator home")) -> None:
    """The SuperLink's runs: id, status, app, time elapsed and since when."""
    from cuvil_edge.coordinator.runs import list_runs

    runs = list_runs(home)
    if not runs:
        console.print("no runs yet (`cuvil-edge run` submits one)")
        return
    table = Table()
    table.add_column("run", no_wrap=True)  # the id `stop` takes: never broken across lines
    for heading in ("status", "app", "elapsed", "since"):
        table.add_column(heading)
    for r in runs:  # Flower's strings, shown as text: Rich would read "[...]" in them as markup
        table.add_row(str(r.run_id), escape(r.status), escape(r.app), _seconds(r.elapsed), escape(r.since))
    console.print(table)


def _seconds(elapsed: str) -> str:
    try:
        return f"{float(elapsed):.0f} s"
    except ValueError:
        return escape(elapsed)


def stop_cmd(
    run_id: int = typer.Argument(..., help="the run to stop (`cuvil-edge runs` lists them)"),
    home: Path = typer.Option(DEFAULT_HOME, "--home", help="the coordinator home"),
) -> None:
    """Stop a run on the SuperLink; its sites are sent nothing more."""
    from cuvil_edge.coordinator.runs import stop_run

    stop_run(home, run_id)
    console.print(f"run {run_id} stopped")
