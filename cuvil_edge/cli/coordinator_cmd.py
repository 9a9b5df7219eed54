"""`cuvil-edge coordinator ...`: the coordinator's durable home, its TLS material and enrollment."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from cuvil_edge.config.home import DEFAULT_HOME

coordinator_app = typer.Typer(no_args_is_help=True, help="The coordinator's home: keys, TLS, enrolled sites.")
console = Console()
_HOME = typer.Option(DEFAULT_HOME, "--home", help="the coordinator home")


@coordinator_app.command("init")
def init(
    home: Path = _HOME, force: bool = typer.Option(False, help="replace existing keys (agents must re-pin)")
) -> None:
    """Create a durable coordinator home: trust root and keys, counters, site registry, folders."""
    from cuvil_edge.config.home import keys_dir
    from cuvil_edge.coordinator.registry import init_home

    init_home(home, force=force)
    console.print(
        f"coordinator home {home}: pin {keys_dir(home) / 'root.json'} on every agent; move "
        f"{keys_dir(home) / 'root.key'} offline when you are not rotating keys"
    )


@coordinator_app.command("certs")
def certs(
    host: list[str] = typer.Option(
        ..., "--host", help="address or name agents reach the SuperLink at (repeat for several)"
    ),
    home: Path = _HOME,
    force: bool = typer.Option(False, help="issue a new server certificate"),
) -> None:
    """Make the federation's CA (once) and a SuperLink server certificate for the given hosts."""
    from cuvil_edge.coordinator.tls import make_certs

    files = make_certs(Path(home) / "tls", host, force=force)
    console.print(
        f"CA {files.ca_cert} (pin it on every agent: `cuvil-edge agent init --ca`), "
        f"server certificate {files.server_cert} for {', '.join(host)}"
    )


@coordinator_app.command("enroll")
def enroll(
    file: Path = typer.Argument(..., help="the enrollment file a device wrote (`cuvil-edge agent init`)"),
    home: Path = _HOME,
    replace: bool = typer.Option(False, help="the site moved to a new device: replace its keys"),
) -> None:
    """Register a site's node key and sealing key; its packages are sealed for it from now on.

    With the SuperLink running (`coordinator serve`) the node is registered with it first (and a
    replaced device's key withdrawn), and the site is recorded only if that worked; otherwise it is
    registered when `serve` next starts. A failed enrollment leaves the registry as it was."""
    from rich.markup import escape

    from cuvil_edge.config.enrollment import Enrollment
    from cuvil_edge.coordinator.registry import SiteRegistry
    from cuvil_edge.coordinator.superlink import DeploymentError, register_enrolled, superlink_up
    from cuvil_edge.errors import CuvilError

    enrollment = Enrollment.read(file)
    site, registry = enrollment.site, SiteRegistry(home)
    entry = registry.entry_for(enrollment, replace=replace)  # every check first; nothing is written yet
    live = superlink_up(home)
    registered, failed = register_enrolled(home, {site: entry}) if live else ({}, {})
    if site in failed and site not in registered:
        raise DeploymentError(
            f"the running SuperLink did not register site {site!r}: {failed[site]}. Nothing was "
            "enrolled; fix that and enroll again"
        )
    try:
        registry.enroll(enrollment, replace=replace, registered=registered.get(site))
    except CuvilError as e:
        if site not in registered:
            raise
        raise DeploymentError(
            f"{e}. Site {site!r} is registered with the SuperLink as node "
            f"{registered[site]['node_id']} but not enrolled: withdraw it (`flwr supernode "
            "unregister ID`) and set the device up again (`cuvil-edge agent init --force`)"
        ) from e
    console.print(
        f"enrolled site {escape(site)} ({escape(enrollment.target)}); its packages are sealed for seal key "
        f"{escape(enrollment.seal_public_key[:16])}..."
    )
    if site in failed:
        console.print(
            f"[yellow]registered {escape(site)} with the running SuperLink, but {escape(failed[site])}; "
            "`cuvil-edge coordinator serve` tries again when it starts[/yellow]"
        )
    elif live:
        console.print(f"registered {escape(site)} with the running SuperLink; the device can join now")
    else:
        console.print("the SuperLink is not running: the node is registered when `cuvil-edge coordinator serve` starts")


@coordinator_app.command("federation")
def federation(
    model: str = typer.Option(..., "--model", help="an .onnx file, or builtin:digits-cnn"),
    home: Path = _HOME,
    out: Path = typer.Option(
        Path("configs/federation.yaml"),
        "--out",
        "-o",
        help="the federation YAML to write; site files go to sites/ beside it",
    ),
    name: str = typer.Option("federation", "--name", help="the federation's name (its checkpoints' folder)"),
    rounds: int = typer.Option(20, "--rounds", min=1, help="rounds the run plans"),
    min_sites: int | None = typer.Option(None, "--min-sites", min=1, help="fewest sites a round needs (default: all)"),
    test: Path | None = typer.Option(
        None, "--test", help="the coordinator's own test records (.npz or .csv; default: the digits test set)"
    ),
    label_column: str | None = typer.Option(None, "--label-column", help="--test CSV: the class column"),
    force: bool = typer.Option(False, help="overwrite existing files"),
) -> None:
    """Write the coordinator's federation YAML over the sites enrolled in the home, and a site
    file for each (its id and target from its enrollment)."""
    from cuvil_edge.config import load_federation, load_site
    from cuvil_edge.config.writers import federation_yaml, site_yaml, write_config
    from cuvil_edge.coordinator.registry import SiteRegistry
    from cuvil_edge.datasets.describe import describe_records
    from cuvil_edge.errors import ConfigError

    enrolled = SiteRegistry(home).sites()
    if not enrolled:
        raise ConfigError(
            f"no site is enrolled in {home}; enroll each device first (`cuvil-edge coordinator enroll FILE`)"
        )
    folder = out.resolve().parent
    site_files = []
    for site, entry in sorted(enrolled.items()):
        path = folder / "sites" / f"{site}.yaml"
        if not path.exists() or force:  # a site file the operator already tuned is kept
            write_config(path, site_yaml(site, entry["target"], None, folder=path.parent), load_site, force=True)
        site_files.append(path)
    facts = describe_records(test, label_column=label_column) if test is not None else None
    write_config(
        out,
        federation_yaml(name, model, site_files, folder=folder, rounds=rounds, min_sites=min_sites, test=facts),
        load_federation,
        force=force,
    )
    console.print(
        f"wrote {out} over {len(site_files)} enrolled sites ({', '.join(sorted(enrolled))}); "
        f"run it: `cuvil-edge run --federation {out} --home {home}`"
    )


@coordinator_app.command("demo-data")
def demo_data(
    sites: list[str] = typer.Argument(..., help="the sites to write a share for, in order"),
    out: Path = typer.Option(Path("data"), "--out", "-o", help="folder for SITE.npz files"),
    force: bool = typer.Option(False, help="overwrite existing files"),
) -> None:
    """Write each site's share of the demo's digits (non-IID, as the demo splits them) as SITE.npz,
    to copy onto the device for a trial without records of your own."""
    import io

    import numpy as np

    from cuvil_edge.atomic import atomic_write
    from cuvil_edge.datasets import digits
    from cuvil_edge.errors import ConfigError

    if len(set(sites)) != len(sites):
        raise ConfigError("each site gets one share: name each site once")
    targets = [Path(out) / f"{site}.npz" for site in sites]
    existing = [str(t) for t in targets if t.exists()]
    if existing and not force:
        raise ConfigError(f"{', '.join(existing)} exist; keep them, or pass --force to write them again")
    Path(out).mkdir(parents=True, exist_ok=True)
    for index, path in enumerate(targets):
        share = digits.site_partition(index, len(sites))
        buffer = io.BytesIO()
        np.savez(buffer, x=share.x, y=share.y)
        atomic_write(path, buffer.getvalue(), mode=0o644)
        console.print(
            f"wrote {path}: {len(share.y)} records of shape {list(share.x.shape[1:])} (copy it to "
            f"{sites[index]}'s device)"
        )


@coordinator_app.command("serve")
def serve(
    home: Path = _HOME,
    address: str = typer.Option(
        "127.0.0.1:9093",
        "--address",
        help="host:port devices reach the Fleet API at (127.0.0.1 unless you mean to expose it, e.g. 0.0.0.0:9093)",
    ),
    operator_address: str = typer.Option(
        "127.0.0.1:9092",
        "--operator-address",
        help="loopback host:port of the SuperLink itself (Control and "
        "Runtime APIs: `cuvil-edge run`, `status`); never exposed",
    ),
) -> None:
    """Run the SuperLink with TLS, node authentication and its database in the home, behind a
    gateway that serves devices only the Fleet API; registers every enrolled site. Stops on
    Ctrl-C or SIGTERM, or when one of its processes stops."""
    import signal
    import sys

    from rich.markup import escape

    from cuvil_edge.coordinator.superlink import start_superlink

    coordinator = start_superlink(
        home, address, log_file=Path(home) / "superlink.log", operator_address=operator_address
    )
    console.print(
        escape(
            f"Fleet API for devices at {address} (TLS, node authentication); SuperLink and operator "
            f"access on {operator_address} only; log {Path(home) / 'superlink.log'}"
        )
    )
    for site, why in coordinator.unregistered.items():
        console.print(escape(f"site {site!r} is not registered, so its device cannot join: {why}"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    code = 0
    try:
        code = coordinator.wait() or 0
        console.print(f"a coordinator process stopped (exit {code}); stopping the others")
    except KeyboardInterrupt:
        pass
    finally:
        coordinator.terminate()
    if code:
        raise typer.Exit(1)
