"""`cuvil-edge plan --federation FILE`: per site, what the federation's model costs on its device at
each precision, and the precision the coordinator would push (coordinator.plan)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def plan_cmd(
    federation: Path = typer.Option(
        Path("configs/federation.yaml"), "--federation", help="federation YAML (its model and site files)"
    ),
) -> None:
    """Show each site's compile plan: package size, peak memory and predicted latency per precision
    against the site's limits, and the precision chosen (or why nothing fits)."""
    from cuvil_edge.config import load_federation
    from cuvil_edge.coordinator.model import load_federation_model
    from cuvil_edge.coordinator.plan import default_latency, plan_federation, precision_variants
    from cuvil_edge.coordinator.precision import federation_calibration

    config = load_federation(federation)
    graph = load_federation_model(config.model, config.seed)
    latency = default_latency()
    calibration = federation_calibration(config.quantization.calibration, graph)
    variants = precision_variants(graph, calibration, config.quantization.method)
    plans = plan_federation(graph, config.load_sites(), variants, latency)
    table = Table(
        "site",
        "target",
        "precision",
        "package MiB",
        "peak MiB",
        "ms (batch 1)",
        "ms (train batch)",
        "round s",
        "fits",
        title=f"compile plan of {config.model}",
    )
    number = lambda v, spec: "-" if v is None else format(v, spec)  # noqa: E731
    for plan in plans:
        for option in plan.options:
            mark = "chosen" if option is plan.chosen else ("yes" if option.fits else "; ".join(option.problems))
            table.add_row(
                plan.site,
                plan.target,
                option.precision,
                f"{option.package_bytes / 2**20:.3f}",
                number(None if option.peak_bytes is None else option.peak_bytes / 2**20, ".2f"),
                number(option.latency_ms, ".2f"),
                number(option.train_batch_ms, ".1f"),
                number(option.round_seconds, ".1f"),
                mark,
            )
    console.print(table)
    for plan in plans:
        choice = plan.chosen.precision if plan.chosen else "[bold red]NOT PUSHED[/bold red]"
        console.print(f"{plan.site} ({plan.target}): {choice}: {plan.reason}")
