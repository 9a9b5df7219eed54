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


# --- the target cannot run it -----------------------------------------------
class TargetError(CuvilError):
    """The target cannot build or run the package."""


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


class LedgerError(PrivacyError):
    """The privacy ledger is unreadable or corrupt; releases are refused until fixed."""
