"""Device target specs: what a target can do, read from ``specs/<name>.yaml``.

A spec is data, not code (see DESIGN.md §2): each YAML file names the
target's architecture, dtypes, SIMD width, memory and peak throughput, with a
comment justifying the numbers.  :meth:`TargetSpec.capabilities` turns a spec
into the ``TARGET_*`` constants that every generated module defines and the
AST pruner folds (:data:`cuvil_edge.ir.ops._util.DEFAULT_CAPABILITIES`).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cuvil_edge.errors import TargetError, TargetSpecError, UnknownTargetError
from cuvil_edge.ir import dtypes as ir_dtypes

#: Folder of the shipped specs.
SPECS_DIR = Path(__file__).parent / "specs"

#: Build precision -> the IR dtype the target must support for it.
PRECISIONS: dict[str, str] = {"fp32": "float32", "fp16": "float16", "int8": "int8"}

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


class TargetSpec(BaseModel):
    """One device target (frozen; unknown fields and loose types are rejected)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str = Field(pattern=_NAME.pattern)
    description: str
    arch: Literal["x86_64", "aarch64", "npu"]
    dtypes: tuple[str, ...] = Field(min_length=1)
    simd_bits: int = Field(ge=0, le=4096)
    accelerator: Literal["none", "gpu", "npu"]
    fp16: bool
    int8: bool
    static_shapes: bool
    static_batch: int = Field(ge=1, le=4096)
    memory_mb: int = Field(gt=0)
    #: The device builds C kernels with its own compiler (``ir/ops/native_*.c``) for the ops
    #: numpy runs slowly; the generated module keeps the numpy path for when that fails.
    native_kernels: bool = False
    #: the int8 dot-product instruction its native kernels use (``ir/ops/native_int8.c``): "vnni"
    #: (AVX-512-VNNI / AVX-VNNI vpdpbusd), "avx2" (vpmaddubsw), "sdot" (ARMv8.2), or "widen" (none:
    #: a widening loop, slower than the float kernels, so int8 packages are widened to float at load)
    int8_dot: Literal["vnni", "avx2", "sdot", "widen"] = "widen"
    peak_gflops: dict[str, float]
    memory_bandwidth_gbs: float = Field(gt=0)
    # --- cost model (cost_model.py; `cuvil-edge calibrate` measures them). Optional: the defaults
    # describe a generic CPU running the numpy kernels, so older spec files stay valid.
    #: Python + numpy cost of one node's kernel call in the generated module (argument passing,
    #: the kernel's own checks, allocating its output): what dominates tiny models.
    call_overhead_us: float = Field(default=10.0, gt=0)
    #: the fixed cost of one call per kernel kind (cost_model's kernel labels, e.g. "conv im2col",
    #: "native"), where it differs from call_overhead_us; a kind not listed costs
    #: call_overhead_us x cost_model.KIND_FACTORS[kind]
    kernel_overhead_us: dict[str, float] = Field(default_factory=dict)
    #: each further numpy call inside one kernel (im2col blocks, depthwise taps, per-sample loops)
    numpy_call_us: float = Field(default=2.0, ge=0)
    #: once per run(): binding the feeds, the module's wrapper, the outputs dict
    run_overhead_us: float = Field(default=20.0, ge=0)
    #: fraction of peak_gflops a large GEMM reaches; a GEMM dim d scales it by d / (d + gemm_half_dim)
    gemm_efficiency: float = Field(default=0.6, gt=0, le=1)
    gemm_half_dim: float = Field(default=16.0, gt=0)
    #: fraction of memory_bandwidth_gbs numpy's elementwise passes reach (a ufunc reads and writes)
    memory_efficiency: float = Field(default=0.7, gt=0, le=1)
    #: a node whose bytes fit in this much cache moves them at cache_bandwidth_gbs (None: no faster)
    cache_mb: float = Field(default=1.0, ge=0)
    cache_bandwidth_gbs: float | None = Field(default=None, gt=0)
    #: the native C kernels' arithmetic rate (depthwise conv, pooling; None: float32 peak / 8)
    native_gflops: float | None = Field(default=None, gt=0)
    #: their fixed cost per image plane (padding a plane, the loop around it)
    native_plane_us: float = Field(default=0.2, ge=0)
    #: ns per element of an exp-class function (Softmax, Sigmoid, Swish, GELU/Erf, Tanh, Exp; fused
    #: activations too), native or numpy: these are bound by the function, not by memory
    transcendental_ns: float = Field(default=2.0, ge=0)
    #: ns per row of a row-wise kernel (native Softmax/LayerNorm rows; numpy reductions per output
    #: element): short rows are bound by the loop around them, not by their elements
    row_ns: float = Field(default=50.0, ge=0)
    #: ns per unit of work of the kernels the builds run, measured by `cuvil-edge calibrate` on
    #: synthetic shapes (keys and their units: cost_kernels.py; e.g. "gemm_flop", "dw_strided_tap",
    #: "weight_byte"); a term not listed falls back to the roofline fields above
    kernel_ns: dict[str, float] = Field(default_factory=dict)
    #: host<->device bus of an accelerator target, per direction (None: memory_bandwidth_gbs, as
    #: for memory shared by CPU and accelerator), and the latency of one transfer
    transfer_bandwidth_gbs: float | None = Field(default=None, gt=0)
    transfer_latency_us: float = Field(default=0.0, ge=0)

    @field_validator("dtypes", mode="before")
    @classmethod
    def _list_to_tuple(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @model_validator(mode="after")
    def _consistent(self) -> TargetSpec:
        unknown = [d for d in self.dtypes if d not in ir_dtypes.SUPPORTED]
        if unknown:
            raise ValueError(f"dtypes {unknown} are not IR dtypes ({', '.join(sorted(ir_dtypes.SUPPORTED))})")
        if self.fp16 != ("float16" in self.dtypes):
            raise ValueError("fp16 must be true exactly when float16 is listed in dtypes")
        if self.int8 != ("int8" in self.dtypes):
            raise ValueError("int8 must be true exactly when int8 is listed in dtypes")
        extra = sorted(set(self.peak_gflops) - set(self.dtypes))
        if extra:
            raise ValueError(f"peak_gflops names dtypes {extra} that are not in dtypes")
        if any(v <= 0 for v in self.peak_gflops.values()):
            raise ValueError("peak_gflops values must be positive")
        if any(not v >= 0 for v in self.kernel_ns.values()):
            raise ValueError("kernel_ns values must be >= 0 (nanoseconds per unit of work)")
        if any(v < 0 for v in self.kernel_overhead_us.values()):
            raise ValueError("kernel_overhead_us values must be >= 0 (microseconds per call)")
        if not self.static_shapes and self.static_batch != 1:
            raise ValueError("static_batch only applies to static_shapes targets; set it to 1")
        return self

    def supports(self, precision: str) -> bool:
        """Whether the target can build at ``precision`` ('fp32', 'fp16', 'int8')."""
        return PRECISIONS.get(precision) in self.dtypes

    def capabilities(self, precision: str = "fp32") -> dict[str, object]:
        """The ``TARGET_*`` constants for a generated module at ``precision``.

        The keys are exactly those of ``ir.ops._util.DEFAULT_CAPABILITIES``.

        Raises:
            TargetError: the target does not support ``precision``.
        """
        if not self.supports(precision):
            ok = [p for p in PRECISIONS if self.supports(p)]
            raise TargetError(
                f"target {self.name!r} cannot build at precision {precision!r}; it supports {', '.join(ok)}"
            )
        return {
            "TARGET_NAME": self.name,
            "TARGET_ARCH": self.arch,
            "TARGET_SIMD_BITS": self.simd_bits,
            "TARGET_HAS_GPU": self.accelerator == "gpu",
            "TARGET_HAS_FP16": self.fp16,
            "TARGET_HAS_INT8": self.int8,
            "TARGET_STATIC_SHAPES": self.static_shapes,
            "TARGET_STATIC_BATCH": self.static_batch,
            "TARGET_MEMORY_MB": self.memory_mb,
            "TARGET_LARGE_SCRATCH": self.memory_mb >= 4096,
            "TARGET_NATIVE": self.native_kernels,
            "TARGET_INT8_DOT": self.int8_dot if self.native_kernels else "none",
            "COMPUTE_FP16": self.fp16 and precision == "fp16",
        }

    @property
    def int8_kernels(self) -> bool:
        """Whether int8 packages compute in int8 here (an int8 dot-product instruction in the native
        kernels), rather than being widened to float at load."""
        return self.native_kernels and self.int8 and self.int8_dot != "widen"

    def digest(self) -> str:
        """sha256 (hex) of the spec's canonical JSON: changes whenever any field changes."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def list_targets(specs_dir: Path | str | None = None) -> list[str]:
    """Names of the targets that have a spec file, sorted."""
    folder = Path(specs_dir) if specs_dir is not None else SPECS_DIR
    return sorted(p.stem for p in folder.glob("*.yaml") if _NAME.match(p.stem))


def load_target(name: str, *, specs_dir: Path | str | None = None) -> TargetSpec:
    """Read and validate the spec ``<specs_dir>/<name>.yaml``.

    Raises:
        UnknownTargetError: no spec has this name (the message lists known targets).
        TargetSpecError: the file is not valid YAML or does not follow the schema.
    """
    folder = Path(specs_dir) if specs_dir is not None else SPECS_DIR
    known = list_targets(folder)
    if not isinstance(name, str) or name not in known:
        raise UnknownTargetError(
            f"unknown device target {name!r}; known targets: {', '.join(known) or '(none)'}. "
            f"Pick one of those or add a spec under {folder}"
        )
    path = folder / f"{name}.yaml"
    try:
        stat = path.stat()
    except OSError as e:
        raise TargetSpecError(f"cannot read target spec {path}: {e}") from e
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    if key in _LOADED:  # every package an agent handles asks again; a first load costs ~8 ms
        return _LOADED[key]
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise TargetSpecError(f"cannot read target spec {path}: {e}") from e
    if not isinstance(data, dict):
        raise TargetSpecError(f"target spec {path} must be a YAML mapping, got {type(data).__name__}")
    try:
        spec = TargetSpec.model_validate(data)
    except ValidationError as e:
        raise TargetSpecError(f"target spec {path} is invalid: {e}") from e
    if spec.name != name:
        raise TargetSpecError(f"target spec {path} is named {spec.name!r}; the name must match the file name")
    _LOADED[key] = spec
    return spec


#: (spec file, its mtime and size) -> the validated, immutable spec; an edited file is read again.
_LOADED: dict[tuple[str, int, int], TargetSpec] = {}


def resolve(target: TargetSpec | str) -> TargetSpec:
    """A spec from a spec or a target name.

    Raises:
        UnknownTargetError, TargetSpecError: see :func:`load_target`.
    """
    return target if isinstance(target, TargetSpec) else load_target(target)
