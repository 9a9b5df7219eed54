"""Federation YAML: the model, the sites, the data split and the rounds."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cuvil_edge.config.loader import load_model, relative_to_file
from cuvil_edge.config.site import DataSection, SiteConfig, load_site
from cuvil_edge.errors import ConfigError

BUILTIN_MODELS = ("builtin:digits-cnn",)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class DatasetSection(_Strict):
    """The demo's data: scikit-learn digits, split non-IID across sites (for sites whose data kind
    is ``digits-partition``), and the coordinator's held-out test set: the digits one, or ``test``,
    records the coordinator holds itself (kind npz, csv or image-folder; see the site ``data``)."""

    name: Literal["digits"] = "digits"
    test_fraction: float = Field(gt=0, lt=1, default=0.2)
    dirichlet_alpha: float = Field(gt=0, default=0.5)
    seed: int = 7
    test: DataSection | None = None

    @field_validator("test")
    @classmethod
    def _test_files(cls, value: DataSection | None) -> DataSection | None:
        if value is not None and value.kind == "digits-partition":
            raise ValueError("test names the coordinator's own test records: kind npz, csv or image-folder")
        return value


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
    max_epsilon: float | None = Field(gt=0, allow_inf_nan=False, default=None)


class FedAvgStrategy(_Strict):
    """Flower's FedAvg: the weighted mean of the sites' replies (weights: each site's ``training.weight``)."""

    name: Literal["fedavg"] = "fedavg"

    def flower_kwargs(self) -> dict:
        """The keyword arguments of the Flower strategy beyond sampling (its own parameter names)."""
        return self.model_dump(exclude={"name"})


class FedProxStrategy(FedAvgStrategy):
    """Flower's FedProx: FedAvg on the server; each site adds mu/2 * ||w - w_received||^2 to its
    local objective (Flower sends ``proximal-mu`` in the train config)."""

    name: Literal["fedprox"] = "fedprox"  # type: ignore[assignment]  # a discriminated union: each strategy narrows name
    proximal_mu: float = Field(ge=0, le=1000, allow_inf_nan=False, default=0.01)


class FedAdamStrategy(FedAvgStrategy):
    """Flower's FedAdam: Adam on the server over the averaged update (Reddi et al., 2020). The
    sites' own learning rate is their ``training.learning_rate`` (Flower's ``eta_l`` is not used)."""

    name: Literal["fedadam"] = "fedadam"  # type: ignore[assignment]  # a discriminated union: each strategy narrows name
    eta: float = Field(gt=0, le=100, allow_inf_nan=False, default=0.1)
    beta_1: float = Field(ge=0, lt=1, default=0.9)
    beta_2: float = Field(ge=0, lt=1, default=0.99)
    tau: float = Field(gt=0, le=1, default=1e-3)


class FedYogiStrategy(FedAdamStrategy):
    """Flower's FedYogi: like FedAdam with Yogi's additive second-moment update."""

    name: Literal["fedyogi"] = "fedyogi"  # type: ignore[assignment]  # a discriminated union: each strategy narrows name
    eta: float = Field(gt=0, le=100, allow_inf_nan=False, default=1e-2)


class FedAvgMStrategy(FedAvgStrategy):
    """Flower's FedAvgM: server SGD with momentum over the averaged update."""

    name: Literal["fedavgm"] = "fedavgm"  # type: ignore[assignment]  # a discriminated union: each strategy narrows name
    server_learning_rate: float = Field(gt=0, le=100, allow_inf_nan=False, default=1.0)
    server_momentum: float = Field(ge=0, lt=1, default=0.9)


#: The strategy section: ``name`` picks one of Flower's strategies, the other keys are its own
#: parameters (unknown keys are errors).
StrategySection = Annotated[
    FedAvgStrategy | FedProxStrategy | FedAdamStrategy | FedYogiStrategy | FedAvgMStrategy,
    Field(discriminator="name"),
]
#: Strategies whose aggregate is FedAvg's mean, the only one Flower's central-DP accountant admits.
MEAN_STRATEGIES = ("fedavg", "fedprox")


class QuantizationSection(_Strict):
    """int8 packages for sites whose compile plan needs them (`cuvil-edge plan`).

    int8 activations are calibrated on sample inputs the coordinator holds itself (public or
    synthetic records, never a site's data): an ``.npz`` with one array per model input, samples
    along axis 0. Without it, int8 is not offered, and a site only int8 would fit is not pushed.
    """

    calibration: Path | None = None
    method: Literal["mse", "minmax", "percentile"] = "mse"

    @field_validator("calibration", mode="before")
    @classmethod
    def _calibration_file(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str):
            path = relative_to_file(value, info)
            if not path.is_file():
                raise ValueError(
                    f"calibration file {path} not found; give an .npz of sample inputs "
                    "(one array per model input, saved with numpy.savez)"
                )
            return path
        return value


class FederationConfig(_Strict):
    """One federation: which model goes to which sites for how many rounds."""

    #: also a folder name (the home's checkpoints/<name>/, runs/<name>-<time>): no separators or dots first
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
    rounds: int = Field(ge=1, le=10000)
    model: str
    sites: list[Path] = Field(min_length=1)
    dataset: DatasetSection = DatasetSection()
    package: PackageSection = PackageSection()
    simulation: SimulationSection = SimulationSection()
    round_timeout: float = Field(gt=0, default=600.0)
    #: Fewest sites a round needs (default: all of them). With fewer, a site that is down does
    #: not stall the run: the round goes on with the others and the report names the failed one.
    min_sites: int | None = Field(ge=1, default=None)
    #: Seconds `cuvil-edge run` waits, before it submits, for enrolled sites that are offline.
    #: When they are still offline then, the run starts without them if at least ``min_sites``
    #: (default: all) are online, and is refused otherwise.
    start_timeout: float = Field(ge=0, le=86400, default=300.0)
    seed: int = 0
    #: Local (record-level) DP-SGD on every site, paid from each site's ledger. With
    #: false, sites train with plain SGD and only their evaluation releases spend.
    local_dp: bool = True
    central_dp: CentralDpSection = CentralDpSection()
    #: Which Flower strategy aggregates the rounds, with its parameters (default: FedAvg).
    strategy: StrategySection = FedAvgStrategy()
    quantization: QuantizationSection = QuantizationSection()

    @field_validator("sites", mode="before")
    @classmethod
    def _relative_sites(cls, value: object, info: ValidationInfo) -> object:
        return [relative_to_file(v, info) for v in value] if isinstance(value, list) else value

    @field_validator("strategy", mode="before")
    @classmethod
    def _default_strategy_name(cls, value: object) -> object:
        if isinstance(value, dict) and "name" not in value:  # parameters without a name: FedAvg's (none)
            return {"name": "fedavg", **value}
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _model_path(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str) and not value.startswith("builtin:"):
            path = relative_to_file(value, info)
            if not path.is_file():
                raise ValueError(
                    f"model file {path} not found; give a path to an .onnx file or one of {BUILTIN_MODELS}"
                )
            return str(path)
        if isinstance(value, str) and value not in BUILTIN_MODELS:
            raise ValueError(f"unknown builtin model; choose one of {BUILTIN_MODELS}")
        return value

    @model_validator(mode="after")
    def _min_sites_fit(self) -> FederationConfig:
        if self.min_sites is not None and self.min_sites > len(self.sites):
            raise ValueError(f"min_sites {self.min_sites} is more than the {len(self.sites)} sites listed")
        if self.min_sites is not None and self.central_dp.enabled and self.min_sites != len(self.sites):
            raise ValueError(
                "central_dp needs every site every round (Flower's accountant counts exactly the "
                "sampled sites); leave min_sites unset"
            )
        if self.central_dp.enabled and self.strategy.name not in MEAN_STRATEGIES:
            raise ValueError(
                f"central_dp needs strategy {' or '.join(MEAN_STRATEGIES)} (Flower's accountant covers "
                f"the noised mean only, not {self.strategy.name}'s server optimiser step)"
            )
        return self

    def load_sites(self) -> list[SiteConfig]:
        """Load every site file; site ids must be unique.

        Raises:
            ConfigError: a site file is invalid, or two files use one site id.
        """
        for path in self.sites:  # the file a YAML entry names, and where it came from
            if not Path(path).is_file():
                raise ConfigError(
                    f"{path}: file not found; check the path (an entry of the federation's `sites:`, "
                    "relative to the federation file)"
                )
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
