"""`cuvil-edge calibrate`: measure this host and write a target spec for the cost model."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

console = Console()


def calibrate_cmd(
    base: str = typer.Option("x86-64", "--base", help="shipped spec the measured one starts from"),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="spec file to write (default: NAME.yaml here); load it with load_target(NAME, specs_dir=its folder)",
    ),
    name: str = typer.Option("host", "--name", help="the spec's name (the file must be NAME.yaml)"),
    quick: bool = typer.Option(False, "--quick", help="shorter timings (a few seconds, noisier)"),
) -> None:
    """Measure this host (one thread: per-kernel terms on synthetic shapes (sgemm, native depthwise and
    LayerNorm, im2col copies, reductions, fresh pages), memory bandwidth, per-call overheads) and write
    a target spec the cost model can plan with."""
    from cuvil_edge.device_targets.calibrate import calibrate, write_spec
    from cuvil_edge.errors import TargetSpecError

    path = output or Path(f"{name}.yaml")
    if path.suffix != ".yaml" or path.stem != name:  # checked before the measurements, not after
        raise TargetSpecError(
            f"--output must be {name}.yaml in some folder (got {path}): load_target finds a spec "
            "by its name; or pass --name to match the file"
        )
    console.print(f"calibrating this host against base spec {base!r} (one thread; ~{5 if quick else 15} s)...")
    result = calibrate(base, name=name, quick=quick)
    path = write_spec(result, path)
    spec, measured = result.spec, result.measured
    table = Table("measured", "value", title=f"spec {spec.name!r}")
    table.add_row("sgemm, best of the kernel shapes", f"{measured['sgemm_best_gflops']:.1f} GFLOP/s")
    table.add_row("gemm efficiency / half-efficiency dim", f"{spec.gemm_efficiency:.3f} / {spec.gemm_half_dim:.1f}")
    table.add_row(
        "memory bandwidth (copy) / numpy efficiency",
        f"{spec.memory_bandwidth_gbs:.1f} GB/s / {spec.memory_efficiency:.2f}",
    )
    table.add_row("cache bandwidth (a + b, 512 KiB)", f"{spec.cache_bandwidth_gbs:.1f} GB/s")
    table.add_row("per-node call / per-run overhead", f"{spec.call_overhead_us:.2f} / {spec.run_overhead_us:.2f} µs")
    for kind, us in spec.kernel_overhead_us.items():
        table.add_row(f"  call: {kind}", f"{us:.2f} µs")
    table.add_row(
        "native kernels",
        f"{spec.native_gflops:.1f} GFLOP/s, {spec.native_plane_us:.3f} µs/plane"
        if spec.native_kernels and spec.native_gflops
        else "not available",
    )
    table.add_row("exp-class function / row loop", f"{spec.transcendental_ns:.3f} ns/element, {spec.row_ns:.1f} ns/row")
    for key, ns in spec.kernel_ns.items():  # per-kernel terms on synthetic shapes (cost_kernels.py)
        table.add_row(f"  kernel: {key}", f"{ns:.4g} ns")
    console.print(table)
    console.print(f"OpenBLAS environment: {result.environment['openblas_env']}")
    console.print(f"wrote {path}")
