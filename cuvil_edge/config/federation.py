"""Federation YAML: the model, the sites, the data split and the rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cuvil_edge.config.loader import load_model
from cuvil_edge.config.site import SiteConfig, load_site
from cuvil_edge.errors import ConfigError

BUILTIN_MODELS = ("builtin:digits-cnn",)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DatasetSection(_Strict):
    """The demo's data: scikit-learn digits, split non-IID across sites."""

    name: Literal["digits"] = "digits"
    test_fraction: float = Field(gt=0, lt=1, default=0.2)
    dirichlet_alpha: float = Field(gt=0, default=0.5)
    seed: int = 7


class PackageSection(_Strict):
    validity_seconds: int = Field(ge=60, le=366 * 86400, default=86400)


class SimulationSection(_Strict):
    client_cpus: int = Field(ge=1, default=1)  # whole CPUs per virtual node (Flower's simulation config)
    ray_cpus: int = Field(ge=1, default=2)


class CentralDpSection(_Strict):
    """User-level (site-level) central DP with Flower's client-side fixed clipping.

    Each site's update (new - received weights) is clipped to L2 <= clipping_norm by
    Flower's ``fixedclipping_mod`` on the agent; the coordinator adds Gaussian noise of
    std noise_multiplier * clipping_norm / m to the average of the m replies, and
    Flower's RDP accountant reports the (ε, delta) of the aggregates released so far.
    See docs/PRIVACY.md.
    """

    enabled: bool = False
    noise_multiplier: float = Field(gt=0, le=1000, default=1.0)
    clipping_norm: float = Field(gt=0, default=1.0)
    delta: float = Field(gt=0, lt=1e-2, default=1e-5)
    #: Optional site-level ε cap (at ``delta``): Flower's accountant refuses, before any
    #: site is asked to train, a round whose release would take the central ε above it;
    #: the run then stops cleanly after the last affordable round. None: reported only.
    max_epsilon: Optional[float] = Field(gt=0, allow_inf_nan=False, default=None)


class QuantizationSection(_Strict):
    """int8 packages for sites whose compile plan needs them (`cuvil-edge plan`).

    int8 activations are calibrated on sample inputs the coordinator holds itself (public or
    synthetic records, never a site's data): an ``.npz`` with one array per model input, samples
    along axis 0. Without it, int8 is not offered, and a site only int8 would fit is not pushed.
    """

    calibration: Optional[Path] = None
    method: Literal["minmax", "percentile"] = "minmax"

    @field_validator("calibration", mode="before")
    @classmethod
    def _calibration_file(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            path = (Path((info.context or {}).get("base_dir", ".")) / value).resolve()
            if not path.is_file():
                raise ValueError(f"calibration file {path} not found; give an .npz of sample inputs "
                                 "(one array per model input, saved with numpy.savez)")
            return path
        return value


class FederationConfig(_Strict):
    """One federation: which model goes to which sites for how many rounds."""

    name: str = Field(min_length=1)
    rounds: int = Field(ge=1, le=10000)
    model: str
    sites: list[Path] = Field(min_length=1)
    dataset: DatasetSection = DatasetSection()
    package: PackageSection = PackageSection()
    simulation: SimulationSection = SimulationSection()
    round_timeout: float = Field(gt=0, default=600.0)
    #: Fewest sites a round needs (default: all of them). With fewer, a site that is down does
    #: not stall the run: the round goes on with the others and the report names the failed one.
    min_sites: Optional[int] = Field(ge=1, default=None)
    seed: int = 0
    #: Local (record-level) DP-SGD on every site, paid from each site's ledger. With
    #: false, sites train with plain SGD and only their evaluation releases spend.
    local_dp: bool = True
    central_dp: CentralDpSection = CentralDpSection()
    quantization: QuantizationSection = QuantizationSection()

    @field_validator("sites", mode="before")
    @classmethod
    def _relative_sites(cls, value: object, info: ValidationInfo) -> object:
        base = Path((info.context or {}).get("base_dir", "."))
        if isinstance(value, list):
            return [(base / v).resolve() if isinstance(v, str) else v for v in value]
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _model_path(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str) and not value.startswith("builtin:"):
            base = Path((info.context or {}).get("base_dir", "."))
            path = (base / value).resolve()
            if not path.is_file():
                raise ValueError(f"model file {path} not found; give a path to an .onnx file or one of {BUILTIN_MODELS}")
            return str(path)
        if isinstance(value, str) and value not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model; choose one of {BUILTIN_MODELS}")
        return value

    @model_validator(mode="after")
    def _min_sites_fit(self) -> "FederationConfig":
        if self.min_sites is not None and self.min_sites > len(self.sites):
            raise ValueError(f"min_sites {self.min_sites} is more than the {len(self.sites)} sites listed")
        if self.min_sites is not None and self.central_dp.enabled and self.min_sites != len(self.sites):
            raise ValueError("central_dp needs every site every round (Flower's accountant counts exactly the "
                             "sampled sites); leave min_sites unset")
        return self

    def load_sites(self) -> list[SiteConfig]:
        """Load every site file; site ids must be unique.

        Raises:
            ConfigError: a site file is invalid, or two files use one site id.
        """
        sites = [load_site(p) for p in self.sites]
        ids = [s.site for s in sites]
        for sid in ids:
            if ids.count(sid) > 1:
                raise ConfigError(f"sites: site id {sid!r} is used by more than one site file; ids must be unique")
        return sites


def load_federation(path: Path | str) -> FederationConfig:
    """Load and validate a federation YAML file (its site files are loaded by :meth:`load_sites`).

    Raises:
        ConfigError: one line naming the file, the key and what is expected.
    """
    return load_model(Path(path), FederationConfig)
