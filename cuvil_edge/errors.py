"""The whole exception tree of cuvil-edge, grouped by whose fault it is.

Every message says what was wrong, where, and what to do about it.
Callers catch the group (``ModelError``, ``PackageError`` ...) and show the
message; tests expect the leaf type.
"""

from __future__ import annotations


class CuvilError(Exception):
    """Base of every error cuvil-edge raises on purpose."""


# --- the model is at fault -------------------------------------------------
class ModelError(CuvilError):
    """The input model cannot be imported or is malformed."""


class MalformedModelError(ModelError):
    """The model file or graph is structurally broken (cycle, dangling input, bad dims...)."""


class ModelFileError(ModelError):
    """The model file is missing or cannot be read."""


class UnsupportedOpError(ModelError):
    """The model uses an op (or op version) the IR does not implement."""


class UnsupportedAttributeError(ModelError):
    """An op attribute or dtype has a value the IR does not implement."""


class ModelIncompatibleError(ModelError):
    """A package's model does not fit the public data metadata of the site YAML (input shape, classes)."""


class ShapeInferenceError(ModelError):
    """Input shapes or dtypes of a node are inconsistent with its op."""


class ExecutionError(ModelError):
    """Running a graph failed (wrong feed names, shapes or dtypes)."""


# --- the package is at fault ------------------------------------------------
class PackageError(CuvilError):
    """A package was rejected; nothing from it was used."""


class PackageSizeError(PackageError):
    """The package or one of its declared parts exceeds a size limit or its real size."""


class PackageFormatError(PackageError):
    """The package bytes do not follow docs/PACKAGE_SPEC.md."""


class SignatureError(PackageError):
    """The manifest signature does not verify against the pinned coordinator key."""


class WrongSiteError(PackageError):
    """The package is addressed to another site."""


class WrongTargetError(PackageError):
    """The package is built for another target."""


class ExpiredPackageError(PackageError):
    """The package's validity window has passed."""


class RollbackError(PackageError):
    """The package version is not newer than the last accepted one."""


class PayloadDigestError(PackageError):
    """The payload bytes do not hash to the digest in the signed manifest."""


# leaf types, one per attack class (PACKAGE_SPEC §12)
class TruncatedPackageError(PackageSizeError):
    """The file ends before a part its prelude or manifest declares."""


class DeclaredLengthError(PackageSizeError):
    """A declared length exceeds its cap or the real size (checked before allocating)."""


class TrailingDataError(PackageFormatError):
    """Bytes follow the last declared part."""


class DuplicateKeyError(PackageFormatError):
    """A JSON object has the same key twice."""


class UnsupportedFormatError(PackageFormatError):
    """An unknown format version, payload type, dtype or field."""


class RegionLayoutError(PackageFormatError):
    """Regions overlap, leave gaps, are unaligned, or padding is not zero."""


class BadShapeError(PackageFormatError):
    """A tensor shape is negative, too large, overflows, or disagrees with its length."""


class BadNameError(PackageFormatError):
    """A name holds a path separator, '..', NUL or control characters."""


class BadSignatureError(SignatureError):
    """A signature by a trusted key does not verify over the exact signed bytes."""


class UntrustedKeyError(SignatureError):
    """No signature comes from a key of the required role."""


class RevokedKeyError(UntrustedKeyError):
    """The signing key was removed from the trust root by a rotation."""


class ThresholdError(SignatureError):
    """Fewer distinct trusted keys signed than the role's threshold."""


class RootRotationError(PackageError):
    """A new trust root is not version N+1 or not signed by the old and new root keys."""


class RootChainTooLongError(RootRotationError):
    """More root updates than the chain cap."""


class ExpiredRootError(RootRotationError):
    """The newest trust root has expired."""


class ManifestMismatchError(PackageError):
    """The per-site manifest and the release statement (or the payload's regions) disagree."""


class RegionDigestError(PayloadDigestError):
    """A region's bytes do not hash to the digest in the signed manifest."""


class ClockRollbackError(ExpiredPackageError):
    """The package expired before the agent's time floor (its clock was set back)."""


class DigestConflictError(RollbackError):
    """Same per-site version as the accepted one but a different manifest digest."""


class ReleaseRollbackError(RollbackError):
    """The release counter is lower than one already accepted."""


class NonceError(PackageError):
    """The manifest lacks the agent's fresh nonce or replays an old one."""


class SealingError(PackageError):
    """A sealed payload cannot be opened or a chunk fails authentication."""


class WrongSealKeyError(SealingError):
    """The payload is sealed for another site's key."""


class StateError(CuvilError):
    """The agent's durable state directory is unreadable or corrupt."""


# --- passes ------------------------------------------------------------------
class PassError(CuvilError):
    """A graph pass failed its precondition, rewrite or postcondition (the pass is named)."""


# --- the configuration is at fault -----------------------------------------
class ConfigError(CuvilError):
    """A YAML config or CLI argument is invalid."""


class KeyFileError(ConfigError):
    """A key file is missing, unreadable or of the wrong kind."""


class DataError(ConfigError):
    """A site's own data files (site YAML ``data``) are missing, malformed or do not fit the model."""


class MissingDependencyError(ConfigError):
    """This install lacks an optional dependency the command needs (pyproject's extras split them by
    role, so a device installs no torch, onnx or Flower it does not use); the message names the
    extra that brings it, e.g. ``pip install 'cuvil-edge[train]'`` (see :mod:`cuvil_edge.extras`)."""

    def __init__(self, what: str, extra: str, missing: tuple[str, ...] = ()) -> None:
        absent = f" ({', '.join(missing)} not installed)" if missing else ""
        super().__init__(f"{what}{absent}: pip install 'cuvil-edge[{extra}]'")
        #: the extra that brings the dependency
        self.extra = extra
        #: the top-level modules found missing
        self.missing = tuple(missing)


# --- the target cannot run it -----------------------------------------------
class TargetError(CuvilError):
    """The target cannot build or run the package."""


class PlanError(TargetError):
    """A site's compile plan does not fit its device or its limits; nothing is pushed to it."""


class UnknownTargetError(TargetError, ConfigError):
    """No device target spec has this name."""


class BuildError(TargetError):
    """Generating, pruning or compiling the module for a target failed."""


class TargetSpecError(TargetError, ConfigError):
    """A device target spec (specs/*.yaml) is unreadable or does not follow the schema."""


# --- privacy -------------------------------------------------------------------
class PrivacyError(CuvilError):
    """A differential-privacy operation was refused or misconfigured."""


class BudgetExhaustedError(PrivacyError):
    """The site's privacy budget would be exceeded; nothing was released."""


class BatchMixingError(PrivacyError):
    """A training graph combines different samples (across the batch axis), so DP-SGD's per-sample
    clipping would not bound one record's influence; training is refused."""


class LedgerError(PrivacyError):
    """The privacy ledger is unreadable or corrupt; releases are refused until fixed."""


class ReplayError(PrivacyError):
    """A request's idempotency key was already claimed: a replayed or duplicated message is
    never trained, evaluated or released again."""


# --- coordinator checkpoints: resuming from a file the coordinator wrote --------------
class CheckpointError(StateError):
    """A coordinator checkpoint cannot be used to resume; nothing of it was used (the message names
    the file and what to do)."""


class CheckpointAuthenticationError(CheckpointError):
    """A checkpoint carries no MAC, or its MAC does not verify under the coordinator home's
    checkpoint key: it was changed after it was written, or written by another home, federation
    or round."""


class NonFiniteCheckpointError(CheckpointError):
    """A checkpoint holds NaN or infinite weights or server-optimiser state, which a resumed run
    would sign and ship to every site."""


class UnsafePathError(StateError):
    """A state or cache directory, or an entry in it, is not private to the agent's user: a
    symbolic link, owned by another user, or writable by group or others (a key file: readable by
    them). Nothing in it was used; the message names the path and the fix."""


# --- the deployment engine ---------------------------------------------------------
class DeploymentError(CuvilError):
    """The SuperLink, a registration or a run on the deployment engine failed."""
