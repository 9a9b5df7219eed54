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

    With the SuperLink running (`coordinator serve`) the node is registered with it at once (and a
    replaced device's key withdrawn); otherwise when `serve` next starts."""
    from cuvil_edge.config.enrollment import Enrollment
    from cuvil_edge.coordinator.registry import SiteRegistry
    from cuvil_edge.coordinator.superlink import register_enrolled, superlink_up

    enrollment = Enrollment.read(file)
    SiteRegistry(home).enroll(enrollment, replace=replace)
    console.print(f"enrolled site {enrollment.site} ({enrollment.target}); its packages are sealed for seal key "
                  f"{enrollment.seal_public_key[:16]}...")
    if superlink_up(home):
        register_enrolled(home)
        console.print(f"registered {enrollment.site} with the running SuperLink; the device can join now")
    else:
        console.print("the SuperLink is not running: the node is registered when `cuvil-edge coordinator serve` "
                      "starts")


@coordinator_app.command("serve")
def serve(home: Path = _HOME, address: str = typer.Option("127.0.0.1:9093", "--address",
                                                         help="host:port agents reach the SuperLink at "
                                                         "(127.0.0.1 unless you mean to expose it)")) -> None:
    """Run the SuperLink with TLS, node authentication and its database in the home; registers
    every enrolled site. Stops on Ctrl-C or SIGTERM."""
    import signal

    from cuvil_edge.coordinator.superlink import start_superlink

    proc = start_superlink(home, address, log_file=Path(home) / "superlink.log")
    console.print(f"SuperLink at {address} (TLS, node authentication); log {Path(home) / 'superlink.log'}")
    signal.signal(signal.SIGTERM, lambda *_: proc.terminate())
    try:
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait(timeout=30)
