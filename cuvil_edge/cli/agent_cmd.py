"""`cuvil-edge agent ...`: commands that run on a site's device."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from cuvil_edge.config.home import DEFAULT_HOME, keys_dir, site_state_dir

agent_app = typer.Typer(no_args_is_help=True, help="Agent-side commands (run on the site's device).")
console = Console()


@agent_app.command("infer")
def infer_cmd(
    package: Path = typer.Argument(..., help="signed package for this site"),
    site: Path = typer.Option(..., "--site", help="this site's YAML"),
    input: Path = typer.Option(..., "--input", help=".npy batch, one record per row"),
    epsilon: float = typer.Option(..., "--epsilon", help="ε this release spends from the site's ledger"),
    output: Path | None = typer.Option(None, "--output", help=".npy file for the noisy outputs"),
    state_dir: Path | None = typer.Option(
        None, "--state-dir", help="agent state directory (default: the site's agent.state_dir, else HOME/agents/<site>)"
    ),
    home: Path = typer.Option(DEFAULT_HOME, "--home", help="federation home (config/home.py)"),
    trust_root: Path | None = typer.Option(
        None,
        "--trust-root",
        help="the federation's root.json, "
        "pinned on first use (default: the site's agent.trust_root, "
        "else HOME/keys/root.json)",
    ),
    clip_l1: float = typer.Option(1.0, "--clip-l1", help="L1 bound of each output row (sensitivity 2·C per release)"),
    request_id: str | None = typer.Option(
        None,
        "--request-id",
        help="ledger key of this release (default: a digest of "
        "the package, input and parameters, so an identical "
        "request is refused instead of released twice)",
    ),
    feature: str | None = typer.Option(
        None,
        "--feature",
        metavar="VALUE_NAME",
        help="release this intermediate value (a node output, "
        "e.g. a Conv's) instead of the model output; each "
        "sample's flattened map is clipped to L1 ≤ C",
    ),
) -> None:
    """Verify and build PACKAGE, run it on --input, and release the outputs (or --feature) under ε-DP."""
    import numpy as np

    from cuvil_edge.agent.inference import infer_private
    from cuvil_edge.agent.runtime import AgentRuntime
    from cuvil_edge.config import load_site
    from cuvil_edge.errors import ConfigError

    config = load_site(site)
    try:
        x = np.load(input, allow_pickle=False)
        data = package.read_bytes()
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read input: {e}") from e
    state = state_dir or site_state_dir(config, home)
    pub = trust_root or config.agent.trust_root or keys_dir(home) / "root.json"
    result = infer_private(
        AgentRuntime(config, state, pub), data, x, epsilon, clip_l1=clip_l1, feature=feature, key=request_id
    )
    if output is not None:
        np.save(output, result.values, allow_pickle=False)
        console.print(f"wrote {output} {result.values.shape}")
    else:
        console.print(result.values)
    console.print(
        f"released {result.output_name} at ε={result.epsilon:g} (L1 sensitivity {result.sensitivity:g}); "
        f"site {config.site} has spent ε={result.eps_spent:.3f}, {result.eps_remaining:.3f} left"
    )


@agent_app.command("new-site")
def new_site_cmd(
    site: str = typer.Argument(..., help="the site's id (lowercase letters, digits, '-')"),
    target: str = typer.Option(
        ...,
        "--target",
        help="this device's spec: rpi4, jetson-orin-nano, ascend-310, x86-64, or a calibrated spec file",
    ),
    data: Path = typer.Option(
        ...,
        "--data",
        help="this device's records: an .npz (arrays x, y), a .csv or a folder with one sub-folder of images per class",
    ),
    out: Path = typer.Option(Path("site.yaml"), "--out", "-o", help="the site YAML to write"),
    epsilon_budget: float = typer.Option(
        8.0,
        "--epsilon-budget",
        help="total ε this site may ever spend (a replacement device: what its predecessor left)",
    ),
    epsilon_per_round: float | None = typer.Option(
        None, "--epsilon-per-round", help="DP-SGD ε of one round (default 2.18, or the budget when less)"
    ),
    label_column: str | None = typer.Option(None, "--label-column", help="CSV: the class column"),
    input_shape: str | None = typer.Option(
        None, "--input-shape", help="one record's shape, e.g. 3,32,32 (needed for image folders)"
    ),
    num_classes: int | None = typer.Option(
        None, "--num-classes", help="the model's classes (default: from the labels)"
    ),
    force: bool = typer.Option(False, help="overwrite an existing file"),
) -> None:
    """Write this device's site YAML: who it is, its target, its privacy budget and its records
    (kind, record shape and classes read from the records, which stay on the device)."""
    from cuvil_edge.config import load_site
    from cuvil_edge.config.writers import site_yaml, write_config
    from cuvil_edge.datasets.describe import describe_records
    from cuvil_edge.errors import ConfigError

    try:
        shape = [int(d) for d in input_shape.split(",")] if input_shape else None
    except ValueError:
        raise ConfigError(f"--input-shape {input_shape!r} must be sizes separated by commas, e.g. 3,32,32") from None
    facts = describe_records(data, label_column=label_column, input_shape=shape, num_classes=num_classes)
    write_config(
        out,
        site_yaml(
            site,
            target,
            facts,
            folder=out.resolve().parent,
            epsilon_budget=epsilon_budget,
            epsilon_per_round=epsilon_per_round,
        ),
        load_site,
        force=force,
    )
    config = load_site(out)
    console.print(
        f"wrote {out}: site {config.site} on {config.target}, ε budget {config.privacy.epsilon_budget:g}, "
        f"{facts.kind} records {list(facts.input_shape or ())} with "
        f"{config.data.model_metadata()[1]} classes; next: `cuvil-edge agent init --site {out} ...`"
    )


@agent_app.command("init")
def init_cmd(
    site: Path = typer.Option(..., "--site", help="this site's YAML"),
    trust_root: Path = typer.Option(..., "--trust-root", help="the federation's root.json, to pin"),
    ca: Path | None = typer.Option(None, "--ca", help="the federation's CA certificate, to pin"),
    home: Path = typer.Option(DEFAULT_HOME, "--home", help="federation home (config/home.py)"),
    force: bool = typer.Option(False, help="make new keys (re-enroll with --replace afterwards)"),
) -> None:
    """Set this device up as SITE: state directory, node and sealing keys, pins, enrollment file."""
    from cuvil_edge.agent.enroll import init_site
    from cuvil_edge.config import load_site

    setup = init_site(load_site(site), trust_root, ca=ca, home=home, force=force)
    console.print(
        f"site {setup.enrollment.site}: state in {setup.state_dir}; give {setup.enrollment_file} "
        "(public keys only) to the coordinator: `cuvil-edge coordinator enroll FILE`"
    )


@agent_app.command("run")
def run_cmd(
    site: Path = typer.Option(..., "--site", help="this site's YAML"),
    superlink: str = typer.Option("127.0.0.1:9093", "--superlink", help="the coordinator's host:port"),
    port: int = typer.Option(9094, "--port", help="this SuperNode's local ClientApp port"),
    home: Path = typer.Option(DEFAULT_HOME, "--home", help="federation home (config/home.py)"),
    partition: str = typer.Option(
        "0/1", "--partition", help="demo data only: INDEX/COUNT of the digits split this site trains on"
    ),
) -> None:
    """Run this site's SuperNode (restarted with back-off while the coordinator is away)."""
    import signal
    import sys
    from functools import partial

    from cuvil_edge.agent.daemon import gate_command, run_forever, supernode_command
    from cuvil_edge.config import load_site
    from cuvil_edge.errors import ConfigError

    try:
        index, count = (int(v) for v in partition.split("/"))
    except ValueError:
        raise ConfigError(f"--partition {partition!r} must be INDEX/COUNT, e.g. 0/3") from None
    config = load_site(site)
    command = supernode_command(config, site, home, superlink, port, (index, count))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # run_once stops the SuperNode on the way out
    sys.exit(run_forever(command, home, partial(gate_command, config, home, port)))
