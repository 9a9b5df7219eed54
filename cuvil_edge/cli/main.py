"""The `cuvil-edge` command: parses, calls, prints. No logic lives here."""

from __future__ import annotations

import logging
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.table import Table

from cuvil_edge.errors import ConfigError as CuvilConfigError, CuvilError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Federated edge deployment: ONNX -> signed per-site packages -> local builds -> DP training.",
)
console = Console()

DEFAULT_STATE = Path(".cuvil")


def _print_version(value: bool) -> None:
    """``--version``: print ``cuvil-edge X.Y.Z`` and exit 0, before any command is parsed."""
    if value:
        from cuvil_edge import __version__

        typer.echo(f"cuvil-edge {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Federated edge deployment: ONNX -> signed per-site packages -> local builds -> DP training."""


@app.command("compile")
def compile_cmd(
    model_arg: Path | None = typer.Argument(None, metavar="MODEL", help="ONNX model file"),
    model: Path | None = typer.Option(None, "--model", help="ONNX model file (instead of MODEL)"),
    site: Path | None = typer.Option(None, "--site", help="site YAML: write a package signed for that site"),
    target: str | None = typer.Option(
        None,
        "--target",
        help="device target: with --output, check it builds the model "
        "and write the unsigned payload; with --report, show the "
        "predicted cost of every node there",
    ),
    output: Path | None = typer.Option(None, "-o", "--output", help="package file to write"),
    quantization: str = typer.Option(
        "fp32", "--enable-quantization", help="weights and activations: fp32, fp16 (weight storage) or int8"
    ),
    calibration: Path | None = typer.Option(
        None, "--calibration", help="int8: sample inputs (.npz, one array per input)"
    ),
    key: Path = typer.Option(DEFAULT_STATE / "keys" / "coordinator.key", help="coordinator private key"),
    validity: int = typer.Option(86400, help="seconds the package stays valid"),
    report: bool = typer.Option(
        False,
        "--report",
        help="show what each optimization pass did, the memory plan per target, and with --target the cost per node",
    ),
    dim: list[str] = typer.Option(
        [],
        "--dim",
        help="NAME=SIZE: plan a dynamic axis other than the "
        "batch at SIZE in the report (repeatable; a site's limits.dims "
        "does this for `plan`)",
    ),
) -> None:
    """Import and optimize MODEL; write a package signed for one site (--site) or a payload checked
    on one target (--target); without either, report only."""
    from cuvil_edge.coordinator.compile import compile_for_site, compile_for_target, optimize_model

    model = model or model_arg
    if model is None or (model_arg is not None and model != model_arg):
        raise CuvilConfigError("compile needs one model: MODEL or --model FILE")
    if site is None and output is None:
        sizes = _dim_sizes(dim)
        graph, info = optimize_model(model, sizes)
        _print_compile_report(info, full=report)
        if target is not None:
            from cuvil_edge.ir.infer import with_sizes

            _print_node_costs(with_sizes(graph, sizes), target)
        return
    if output is None:
        raise CuvilConfigError("compile --site needs -o/--output, the package file to write")
    if site is not None:
        result = compile_for_site(
            model,
            site,
            output,
            key,
            validity,
            versions=DEFAULT_STATE / "versions.json",
            precision=quantization,
            calibration=calibration,
        )
        written = f"for site {result.site} on {result.target}, version {result.version}"
    elif target is not None:
        result = compile_for_target(model, target, output, precision=quantization, calibration=calibration)
        written = f"payload for target {result.target} (built and run there; --site signs a package for one site)"
    else:
        raise CuvilConfigError("compile -o needs --site SITE.yaml (a signed package) or --target NAME (a payload)")
    if report and result.report is not None:
        _print_compile_report(result.report, full=True)
    console.print(f"wrote {output} ({result.size:,} bytes) {written}, {result.nodes} nodes; {result.precision_note}")


def _dim_sizes(given: list[str]) -> dict[str, int]:
    """``--dim seq=128`` options as ``{"seq": 128}``."""
    sizes: dict[str, int] = {}
    for item in given:
        name, _, size = item.partition("=")
        if not name or not size.isdigit() or int(size) < 1:
            raise CuvilConfigError(f"--dim {item!r}: write NAME=SIZE with a positive size, e.g. --dim seq=128")
        sizes[name.strip()] = int(size)
    return sizes


def _print_node_costs(graph, target: str) -> None:
    from cuvil_edge.device_targets.cost_model import predict

    cost = predict(graph, target)
    table = Table(
        "node",
        "op",
        "kernel",
        "MFLOP",
        "KiB moved",
        "ms",
        "bound",
        title=f"predicted cost on {target} (batch 1; device_targets.cost_model)",
    )
    for n in cost.nodes:
        table.add_row(
            n.node,
            n.op_type,
            n.kernel,
            f"{n.flops / 1e6:,.2f}",
            f"{(n.bytes_read + n.bytes_written + n.scratch_bytes) / 1024:,.0f}",
            f"{n.seconds * 1e3:.3f}",
            str(getattr(n.bound, "value", n.bound)),
        )
    console.print(table)
    console.print(
        f"predicted total: {cost.seconds * 1e3:.2f} ms per inference, peak memory "
        f"{cost.peak_memory_bytes / 2**20:.2f} MiB"
    )


def _print_compile_report(info, full: bool) -> None:
    if full:
        table = Table("pass", "nodes before", "nodes after", "changes", title="optimization passes")
        for name, before, after, changes in info.passes:
            shown = "\n".join(changes[:12]) + (f"\n... and {len(changes) - 12} more" if len(changes) > 12 else "")
            table.add_row(name, str(before), str(after), shown or "-")
        console.print(table)
    console.print(f"nodes: {info.nodes_before} -> {info.nodes_after} ({info.iterations} iterations to a fixed point)")
    console.print(
        f"total (batch 1): {info.flops:,} FLOPs, {info.macs / 1e9:.3f} GMAC, {info.parameter_bytes:,} parameter bytes"
    )
    if full and info.memory:
        mib = lambda b: f"{b / 2**20:,.2f}"  # noqa: E731
        table = Table(
            "target",
            "planned peak MiB",
            "weights MiB",
            "weights + two largest live MiB",
            title="memory plan of one inference (batch 1; device_targets.memory_plan)",
        )
        for target, peak, weights, bound in info.memory:
            table.add_row(target, *((mib(peak), mib(weights), mib(bound)) if peak is not None else ("-", "-", bound)))
        console.print(table)


@app.command("inspect")
def inspect_cmd(
    package: Path = typer.Argument(..., help="package file"),
    key: Path | None = typer.Option(None, help="also verify the signature with this public key"),
) -> None:
    """Show a package's manifest, ops, tensors and FLOPs."""
    from cuvil_edge.coordinator.compile import inspect_package

    info = inspect_package(package, key)
    console.print(f"[bold]{package}[/bold]  signature: {info.signature}")
    for k, v in info.manifest.items():
        if k in ("issued_at", "expires"):
            v = f"{v} ({datetime.fromtimestamp(v, UTC):%Y-%m-%d %H:%M:%S} UTC)"
        console.print(f"  {k:<16} {v}")
    ops = Table("op", "count", "FLOPs (batch 1)", title="ops")
    for op, (count, flops) in sorted(info.ops.items()):
        ops.add_row(op, str(count), f"{flops:,}")
    console.print(ops)
    tensors = Table("tensor", "dtype", "shape", "bytes", title="tensors")
    for name, dtype, shape, size in info.tensors:
        tensors.add_row(name, dtype, str(shape), f"{size:,}")
    console.print(tensors)
    console.print(f"total: {info.total_flops:,} FLOPs per sample, {info.parameter_bytes:,} parameter bytes")


@app.command("demo")
def demo(
    federation: Path = typer.Option(Path("configs/federation.yaml"), help="federation YAML"),
    rounds: int | None = typer.Option(None, help="override the number of rounds"),
    run_dir: Path | None = typer.Option(None, help="run directory (default runs/<name>-<time>)"),
    home: Path = typer.Option(
        DEFAULT_STATE,
        "--home",
        help="durable home: keys, version counters, each site's state and privacy ledger (kept across runs)",
    ),
    resume: bool = typer.Option(False, "--resume", help="continue from the newest checkpoint in the home"),
    deployment: bool = typer.Option(
        False,
        "--deployment",
        help="run it on Flower's deployment engine on "
        "127.0.0.1 instead: a TLS SuperLink with node authentication and one "
        "enrolled SuperNode per site, set up in the run directory and stopped after",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also show Flower's and Ray's logs"),
) -> None:
    """Run the demo federation in Flower simulation and report each round.

    Sites spend from their durable ledgers in the home across runs; once their budgets are
    spent they sit rounds out. The demo's data is public, so a new home starts afresh."""
    from cuvil_edge.cli.local_federation import APP_DIR
    from cuvil_edge.coordinator.launcher import RunFailedError, prepare_run, run_in_simulation
    from cuvil_edge.coordinator.superlink import RunEndedError

    if not verbose:
        os.environ.setdefault("FLWR_LOG_LEVEL", "WARNING")
        logging.getLogger("flwr").setLevel(logging.WARNING)
    try:
        if deployment:
            _demo_on_deployment(federation, run_dir, rounds, verbose)
            return
        spec = prepare_run(federation, run_dir, rounds, home=home, resume=resume)
        console.print(f"run directory: {spec.run_dir}")
        console.print(
            f"federation home: {spec.home} (keys, version counters, each site's state and privacy "
            "ledger; they persist across runs)"
        )
        if spec.start_round:
            console.print(
                f"resuming after round {spec.start_round} of {spec.start_round + spec.rounds}: "
                f"{spec.rounds} round{'' if spec.rounds == 1 else 's'} left"
            )
        metrics = run_in_simulation(spec, APP_DIR, verbose=verbose)
    except (RunFailedError, RunEndedError) as e:  # the run failed, not its configuration: exit 1
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    final = metrics["rounds"][-1]
    worst = max(s.get("eps-spent", 0.0) for s in final["sites"].values())
    console.print(
        f"[bold]final global test accuracy {final['global_accuracy']:.4f}[/bold], largest site ε spent {worst:.3f}"
    )
    if metrics.get("stopped_early"):
        from cuvil_edge.coordinator.report import format_stop

        console.print(f"[bold]{format_stop(metrics['stopped_early'])}[/bold]")
    console.print(f"metrics: {spec.run_dir}/metrics.json  plot: {spec.run_dir}/metrics.png")
    if final["sites"] and all(s.get("status") == "budget exhausted" for s in final["sites"].values()):
        console.print(
            f"[bold]every site's privacy budget in {spec.home} is spent[/bold]; the demo's data is public, "
            "so `cuvil-edge demo --home NEW_DIR` starts a new demo federation with fresh ledgers"
        )


def _demo_on_deployment(federation: Path, run_dir: Path | None, rounds: int | None, verbose: bool) -> None:
    import time

    from cuvil_edge.cli.local_federation import APP_DIR, local_federation
    from cuvil_edge.config import load_federation
    from cuvil_edge.coordinator.superlink import submit_run

    root = run_dir or Path("runs") / f"{load_federation(federation).name}-{time.strftime('%Y%m%d-%H%M%S')}-deployment"
    console.print(f"setting up a coordinator and one device per site in {root} (TLS, node authentication)...")
    with local_federation(root, federation) as fed:
        console.print(f"SuperLink {fed.address}, {len(fed.supernodes)} SuperNodes online; federation home {fed.home}")
        submit_run(fed.home, APP_DIR, federation, rounds, verbose=verbose)
    console.print(f"done; reports in {fed.home / 'runs'}, logs in {root}; every process was stopped")


@app.command("run")
def run_federation_cmd(
    federation: Path = typer.Option(Path("configs/federation.yaml"), help="federation YAML"),
    home: Path = typer.Option(DEFAULT_STATE, "--home", help="the coordinator home"),
    rounds: int | None = typer.Option(
        None, help="override the number of rounds (with --resume: the total, rounds done included)"
    ),
    resume: bool = typer.Option(
        False,
        "--resume",
        help="continue from the newest checkpoint in the home: the rounds its run planned and did not do",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="also show Flower's log lines"),
) -> None:
    """Submit the federation to the running SuperLink (`coordinator serve`) and stream its rounds.

    Checks first, before anything reaches the SuperLink: the federation, its model and site files,
    that every listed site is enrolled, and that they are online (waiting up to the federation's
    start_timeout for those that are not). Exits 2 when a check fails, 1 when the run fails."""
    from rich.markup import escape

    from cuvil_edge.cli.local_federation import APP_DIR
    from cuvil_edge.config import load_federation
    from cuvil_edge.coordinator import preflight
    from cuvil_edge.coordinator.model import load_federation_model
    from cuvil_edge.coordinator.superlink import RunEndedError, submit_run

    # a bad file is one line here, not a failed run in the SuperLink's log
    config = load_federation(federation)
    sites = config.load_sites()
    load_federation_model(config.model, config.seed)
    if resume:
        from cuvil_edge.coordinator.checkpoints import resume_plan

        done, total = resume_plan(home, federation, rounds)
        console.print(
            f"resuming {escape(config.name)} after round {done} of {total}: {total - done} round"
            f"{'' if total - done == 1 else 's'} left",
            soft_wrap=True,
        )
    listed = {site.site: path for site, path in zip(sites, config.sites, strict=True)}
    missing = preflight.wait_for_sites(
        home,
        listed,
        min_sites=config.min_sites,
        start_timeout=config.start_timeout,
        echo=lambda line: console.print(escape(line), soft_wrap=True),
    )
    try:
        status = submit_run(home, APP_DIR, federation, rounds, resume=resume, verbose=verbose)
    except RunEndedError as e:
        print(f"error: {e}", file=sys.stderr)
        raise typer.Exit(1) from None
    reports = max((p for p in (Path(home) / "runs").glob("run-*") if (p / "metrics.json").exists()), default=None)
    console.print(
        escape(
            f"run {status}"
            + (f" without {', '.join(missing)}" if missing else "")
            + f"; reports in {reports or Path(home) / 'runs'}"
        ),
        soft_wrap=True,
    )


@app.command("status")
def status_cmd(home: Path = typer.Option(DEFAULT_STATE, "--home", help="the coordinator home")) -> None:
    """Enrolled sites, which are online, the last round and each site's reported ε. Exits 1 when
    the home's SuperLink does not answer."""
    from rich.markup import escape
    from rich.table import Table

    from cuvil_edge.coordinator.status import SUPERLINK_DOWN_EXIT, federation_status

    st = federation_status(home)
    console.print(
        f"SuperLink: {escape(st.superlink)}; last round: "
        f"{st.last_round if st.last_round is not None else '-'}"
        + (f" ({escape(str(st.run_dir))})" if st.run_dir else "")
    )
    table = Table("site", "target", "registered", "online", "last status", "ε spent", "ε left")
    for s in st.sites:  # stored strings: Rich would read "[...]" in them as markup
        table.add_row(
            escape(s.site),
            escape(s.target),
            "yes" if s.registered else "no",
            "?" if s.online is None else ("yes" if s.online else "no"),
            escape(s.last_status or "-"),
            "-" if s.eps_spent is None else f"{s.eps_spent:.3f}",
            "-" if s.eps_remaining is None else f"{s.eps_remaining:.3f}",
        )
    console.print(table)
    if st.reachable is False:
        raise typer.Exit(SUPERLINK_DOWN_EXIT)


def _mount_subcommands() -> None:
    """Command groups live in their own modules (one owner each); they are mounted here."""
    from cuvil_edge.cli.agent_cmd import agent_app
    from cuvil_edge.cli.agent_keys_cmd import agent_keys_app
    from cuvil_edge.cli.calibrate_cmd import calibrate_cmd
    from cuvil_edge.cli.coordinator_cmd import coordinator_app
    from cuvil_edge.cli.keys_cmd import keys_app
    from cuvil_edge.cli.ops_cmd import ops_cmd
    from cuvil_edge.cli.plan_cmd import plan_cmd
    from cuvil_edge.cli.privacy_cmd import privacy_app
    from cuvil_edge.cli.runs_cmd import runs_cmd, stop_cmd

    app.add_typer(keys_app, name="keys")
    agent_app.add_typer(agent_keys_app, name="keys")
    app.add_typer(agent_app, name="agent")
    app.add_typer(privacy_app, name="privacy")
    app.add_typer(coordinator_app, name="coordinator")
    app.command("calibrate")(calibrate_cmd)
    app.command("plan")(plan_cmd)
    app.command("ops")(ops_cmd)
    app.command("runs")(runs_cmd)
    app.command("stop")(stop_cmd)


def mounted_app() -> typer.Typer:
    """The ``cuvil-edge`` command with every command group mounted (mounted once per process)."""
    if not app.registered_groups:
        _mount_subcommands()
    return app


def main(argv: list[str] | None = None) -> int:
    """Entry point: every expected failure becomes one line on stderr and exit code 2."""
    try:
        code = mounted_app()(args=argv, standalone_mode=False)  # a command's typer.Exit(N) comes back as N
    except CuvilError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except click.ClickException as e:
        e.show()
        return e.exit_code
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
