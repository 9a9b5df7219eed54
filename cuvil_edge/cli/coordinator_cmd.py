"""`cuvil-edge coordinator ...`: the coordinator's durable home, its TLS material and enrollment."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer
from rich.console import Console

from cuvil_edge.config.home import DEFAULT_HOME

coordinator_app = typer.Typer(no_args_is_help=True, help="The coordinator's home: keys, TLS, enrolled sites.")
console = Console()
_HOME = typer.Option(DEFAULT_HOME, "--home", help="the coordinator home")


@coordinator_app.command("init")
def init(home: Path = _HOME, force: bool = typer.Option(False, help="replace existing keys (agents must re-pin)")) -> None:
    """Create a durable coordinator home: trust root and keys, counters, site registry, folders."""
    from cuvil_edge.config.home import keys_dir
    from cuvil_edge.coordinator.registry import init_home

    init_home(home, force=force)
    console.print(f"coordinator home {home}: pin {keys_dir(home) / 'root.json'} on every agent; move "
                  f"{keys_dir(home) / 'root.key'} offline when you are not rotating keys")


@coordinator_app.command("certs")
def certs(host: List[str] = typer.Option(..., "--host", help="address or name agents reach the SuperLink at "
                                         "(repeat for several)"),
          home: Path = _HOME, force: bool = typer.Option(False, help="issue a new server certificate")) -> None:
    """Make the federation's CA (once) and a SuperLink server certificate for the given hosts."""
    from cuvil_edge.coordinator.tls import make_certs

    files = make_certs(Path(home) / "tls", host, force=force)
    console.print(f"CA {files.ca_cert} (pin it on every agent: `cuvil-edge agent init --ca`), "
                  f"server certificate {files.server_cert} for {', '.join(host)}")


@coordinator_app.command("enroll")
def enroll(file: Path = typer.Argument(..., help="the enrollment file a device wrote (`cuvil-edge agent init`)"),
           home: Path = _HOME,
           replace: bool = typer.Option(False, help="the site moved to a new device: replace its keys")) -> None:
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
        raise DeploymentError(f"the running SuperLink did not register site {site!r}: {failed[site]}. Nothing was "
                              "enrolled; fix that and enroll again")
    try:
        registry.enroll(enrollment, replace=replace, registered=registered.get(site))
    except CuvilError as e:
        if site not in registered:
            raise
        raise DeploymentError(f"{e}. Site {site!r} is registered with the SuperLink as node "
                              f"{registered[site]['node_id']} but not enrolled: withdraw it (`flwr supernode "
                              "unregister ID`) and set the device up again (`cuvil-edge agent init --force`)") from e
    console.print(f"enrolled site {escape(site)} ({escape(enrollment.target)}); its packages are sealed for seal key "
                  f"{escape(enrollment.seal_public_key[:16])}...")
    if site in failed:
        console.print(f"[yellow]registered {escape(site)} with the running SuperLink, but {escape(failed[site])}; "
                      "`cuvil-edge coordinator serve` tries again when it starts[/yellow]")
    elif live:
        console.print(f"registered {escape(site)} with the running SuperLink; the device can join now")
    else:
        console.print("the SuperLink is not running: the node is registered when `cuvil-edge coordinator serve` "
                      "starts")


@coordinator_app.command("serve")
def serve(home: Path = _HOME, address: str = typer.Option("127.0.0.1:9093", "--address",
                                                         help="host:port devices reach the Fleet API at "
                                                         "(127.0.0.1 unless you mean to expose it, e.g. "
                                                         "0.0.0.0:9093)"),
          operator_address: str = typer.Option("127.0.0.1:9092", "--operator-address",
                                                help="loopback host:port of the SuperLink itself (Control and "
                                                "Runtime APIs: `cuvil-edge run`, `status`); never exposed")) -> None:
    """Run the SuperLink with TLS, node authentication and its database in the home, behind a
    gateway that serves devices only the Fleet API; registers every enrolled site. Stops on
    Ctrl-C or SIGTERM, or when one of its processes stops."""
    import signal
    import sys

    from rich.markup import escape

    from cuvil_edge.coordinator.superlink import start_superlink

    coordinator = start_superlink(home, address, log_file=Path(home) / "superlink.log",
                                  operator_address=operator_address)
    console.print(escape(f"Fleet API for devices at {address} (TLS, node authentication); SuperLink and operator "
                         f"access on {operator_address} only; log {Path(home) / 'superlink.log'}"))
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
