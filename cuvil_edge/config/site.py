"""Site YAML: who a site is, what hardware it runs, and its privacy budget.

One file per site under ``configs/sites/``.  The coordinator reads it to
address and target packages; the agent reads it to verify, build, train and
spend its budget.  Paths inside are relative to the file.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cuvil_edge.config.loader import load_model, relative_to_file
from cuvil_edge.ir.dims import SYMBOL

SITE_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
#: The demo's digits partition (scikit-learn's 8x8 digits): public, so its model check needs no YAML key.
DIGITS_INPUT_SHAPE, DIGITS_CLASSES = (1, 8, 8), 10


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class PrivacySection(_Strict):
    """Per-site differential-privacy budget (record-level, add/remove neighbours)."""

    epsilon_budget: float = Field(gt=0, description="total ε this site may ever spend")
    delta: float = Field(gt=0, lt=1e-2, default=1e-5)
    epsilon_per_round: float = Field(gt=0, description="DP-SGD target ε for one round of local training")
    eval_epsilon: float = Field(gt=0, default=0.05, description="ε per released evaluation metric")
    local_dp: bool = Field(default=True, description="train with DP-SGD (deployment engine; the site decides)")

    @model_validator(mode="after")
    def _fits(self) -> PrivacySection:
        for name in ("epsilon_budget", "epsilon_per_round", "eval_epsilon"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")
        if self.epsilon_per_round > self.epsilon_budget:
            raise ValueError("epsilon_per_round must not exceed epsilon_budget")
        return self


class TrainingSection(_Strict):
    """Local DP-SGD hyperparameters: public configuration, so nothing derived from them (the noise,
    the steps, the ε a round costs) depends on how many records the site holds."""

    local_epochs: int = Field(ge=1, le=100, default=2, description="steps per round = ceil(local_epochs / sample_rate)")
    batch_size: int = Field(
        ge=1, le=65536, default=32, description="expected batch size: normalises the noisy gradient sum"
    )
    sample_rate: float = Field(
        gt=0, le=1, default=0.08, description="Poisson sampling rate of DP-SGD; pick about batch_size / records"
    )
    learning_rate: float = Field(gt=0, le=10, default=0.1)
    momentum: float = Field(ge=0, lt=1, default=0.0)
    max_grad_norm: float = Field(gt=0, default=1.0)
    weight: int = Field(
        ge=1, le=10**9, default=1, description="public FedAvg weight of this site's updates (never its record count)"
    )


class DataSection(_Strict):
    """Where the site's local records come from. The agent reads them from this device's own files;
    nothing from the coordinator decides which data a site reads (the demo's digits partition is
    computed locally from the federation's public split parameters).

    ``npz``: arrays ``x`` (records, shaped like the model's input without the batch axis) and ``y``
    (integer labels). ``csv``: a header row; ``label_column`` and the ``feature_columns`` (default:
    every other column, in file order) by name. ``image-folder``: one sub-folder per class holding
    PNG/JPEG files, resized to the model's input. Labels are indices ``0 .. classes-1``, or names
    listed in ``classes`` (whose order then gives the indices; for image folders, the sub-folder names).

    **Public model metadata**. ``input_shape`` (one record's shape, the model's
    input without the batch axis) and ``num_classes`` (the model's outputs) are public facts about
    the site's data: the agent checks every package's model against them *before reading any
    record* and refuses a mismatch with the code ``model-incompatible``, so no coordinator can probe
    the records with models of other shapes. Defaults (:meth:`model_metadata`): ``num_classes`` is
    ``len(classes)`` when ``classes`` is listed; for ``csv`` with ``feature_columns`` the input shape
    is ``[len(feature_columns)]``; the digits partition is public (``[1, 8, 8]``, 10 classes). For
    a file source where either stays unknown, the safe default: every package is refused
    (``model-incompatible``, the device's log says which key to add); the check is never skipped.
    """

    kind: Literal["digits-partition", "npz", "csv", "image-folder"] = "digits-partition"
    path: Path | None = None
    label_column: str | None = None
    feature_columns: list[str] | None = None
    classes: list[str] | None = None
    input_shape: list[int] | None = Field(
        default=None,
        description="one record's shape: the model input "
        "without the batch axis (public; checked before any record is read)",
    )
    num_classes: int | None = Field(
        default=None, ge=1, le=1_000_000, description="the model's number of classes (public; default len(classes))"
    )
    eval_fraction: float = Field(gt=0, lt=1, default=0.2)
    #: Ignored: the split is decided per record by a keyed hash (datasets/split.py), not by a shuffle;
    #: kept so that site files written for older releases still load.
    seed: int = Field(ge=0, default=0, description="ignored (the train / eval split is per record)")

    @field_validator("path", mode="before")
    @classmethod
    def _relative_to_file(cls, value: object, info: ValidationInfo) -> object:
        return relative_to_file(value, info)

    def model_metadata(self) -> tuple[tuple[int, ...] | None, int | None]:
        """(record shape, number of classes) every package's model must have; None where the site
        YAML does not say (the agent then refuses every package: see the class docstring)."""
        if self.kind == "digits-partition":
            return DIGITS_INPUT_SHAPE, DIGITS_CLASSES
        shape = (
            tuple(self.input_shape)
            if self.input_shape is not None
            else ((len(self.feature_columns),) if self.kind == "csv" and self.feature_columns else None)
        )
        classes = self.num_classes if self.num_classes is not None else (len(self.classes) if self.classes else None)
        return shape, classes

    @model_validator(mode="after")
    def _complete(self) -> DataSection:
        if self.input_shape is not None and (not self.input_shape or any(d < 1 for d in self.input_shape)):
            raise ValueError(
                "input_shape must list one or more positive dimensions (the model input without the batch axis)"
            )
        if self.classes and self.num_classes is not None and self.num_classes != len(self.classes):
            raise ValueError(f"num_classes {self.num_classes} differs from the {len(self.classes)} names in classes")
        if self.kind == "digits-partition":
            if (
                self.input_shape is not None and tuple(self.input_shape) != DIGITS_INPUT_SHAPE
            ) or self.num_classes not in (None, DIGITS_CLASSES):
                raise ValueError(
                    f"the digits partition has input_shape {list(DIGITS_INPUT_SHAPE)} and {DIGITS_CLASSES} classes"
                )
            if self.path is not None or self.label_column or self.feature_columns or self.classes:
                raise ValueError(
                    "kind digits-partition reads no files; path, label_column, feature_columns "
                    "and classes belong to kinds npz, csv and image-folder"
                )
            return self
        if self.path is None:
            raise ValueError(f"kind {self.kind} needs path: the site's {self.kind} data, relative to this file")
        if self.kind == "csv" and not self.label_column:
            raise ValueError("kind csv needs label_column: the name of the column holding each record's class")
        if self.kind != "csv" and (self.label_column or self.feature_columns):
            raise ValueError(f"label_column and feature_columns are for kind csv, not {self.kind}")
        if self.feature_columns is not None and (
            not self.feature_columns or len(set(self.feature_columns)) != len(self.feature_columns)
        ):
            raise ValueError("feature_columns must list distinct column names")
        if self.classes is not None and (not self.classes or len(set(self.classes)) != len(self.classes)):
            raise ValueError("classes must list distinct class names")
        return self


class AgentSection(_Strict):
    """Agent-side settings; the paths default to what the launcher provisions."""

    state_dir: Path | None = None
    trust_root: Path | None = None
    keep_packages: int = Field(ge=1, le=1000, default=3, description="verified packages kept on disk, newest first")
    max_package_bytes: int = Field(
        ge=4096, le=2**40, default=512 * 2**20, description="largest package accepted; checked before anything else"
    )

    @field_validator("state_dir", "trust_root", mode="before")
    @classmethod
    def _relative_to_file(cls, value: object, info: ValidationInfo) -> object:
        return relative_to_file(value, info)


class LimitsSection(_Strict):
    """What the site's device can afford (all optional): `cuvil-edge plan` checks every precision
    against them, and the coordinator does not push a package whose plan breaks one."""

    latency_ms: float | None = Field(default=None, gt=0, description="slowest acceptable inference, batch 1")
    memory_mb: float | None = Field(default=None, gt=0, description="most memory one inference may take at its peak")
    download_mb: float | None = Field(default=None, gt=0, description="largest package the site's link should carry")
    dims: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "the largest size of each dynamic axis other than the batch (a sequence length, an image side), "
            "e.g. {seq: 128}: memory and latency are planned at these sizes; the device runs any size"
        ),
    )

    @field_validator("dims")
    @classmethod
    def _dims(cls, value: dict[str, int]) -> dict[str, int]:
        for name, size in value.items():
            if not SYMBOL.match(name):
                raise ValueError(f"limits.dims key {name!r} must name a dynamic axis of the model (letters, digits, _)")
            if isinstance(size, bool) or not 1 <= size <= 2**24:
                raise ValueError(f"limits.dims.{name} must be an int from 1 to {2**24}, got {size!r}")
        return value


class SiteConfig(_Strict):
    """A site: one edge device or one institution."""

    site: str = Field(pattern=SITE_ID_PATTERN, description="site id, lowercase letters, digits and '-'")
    target: str
    precision: Literal["fp32", "fp16"] = "fp32"
    description: str = ""
    privacy: PrivacySection
    training: TrainingSection = TrainingSection()
    data: DataSection = DataSection()
    agent: AgentSection = AgentSection()
    limits: LimitsSection = LimitsSection()

    @field_validator("target")
    @classmethod
    def _known_target(cls, value: str) -> str:
        from cuvil_edge.device_targets import load_target  # a config names a target spec by name

        try:
            spec = load_target(value)
        except Exception as e:  # noqa: BLE001 - UnknownTargetError, re-raised so pydantic names the key
            raise ValueError(str(e)) from None
        return spec.name

    @model_validator(mode="after")
    def _precision_supported(self) -> SiteConfig:
        from cuvil_edge.device_targets import load_target

        if self.precision == "fp16" and not load_target(self.target).fp16:
            raise ValueError(f"target {self.target} has no fp16; use precision: fp32")
        return self


def load_site(path: Path | str) -> SiteConfig:
    """Load and validate a site YAML file.

    Raises:
        ConfigError: one line naming the file, the key and what is expected.
    """
    return load_model(Path(path), SiteConfig)
