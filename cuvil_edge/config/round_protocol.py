"""The round protocol: every request and reply between the coordinator and a site (DESIGN.md §2,
layer 4½, shared by coordinator and agent).

Each message is a :class:`MessageSpec`: the Flower records it carries and, for each, its
:class:`Field` s (key, type, sensitivity). Both sides read the key strings from here only; a site
builds its replies with :meth:`MessageSpec.metrics`, which refuses a key the spec does not list.
:func:`privacy_table` renders what leaves a site, the table docs/PRIVACY.md keeps (a test compares
the two).

A failure reply carries one :class:`Failure` from a fixed set: its numeric code and, as the reason,
its name, nothing else (DESIGN.md §3 Privacy: nothing derived from the data leaves in an error).
What went wrong goes to the device's own log.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum


class Sensitivity(str, Enum):  # noqa: UP042 - StrEnum would change str() and format() to the bare value
    """What a value that leaves a site may depend on."""

    #: A function of public configuration (site YAML, federation file, the package) only.
    PUBLIC = "public configuration"
    #: Measured on public inputs (the package, the device) before any record is read.
    MEASURED = "measured before any record is read"
    #: Computed from the site's records, noised and charged to the site's ledger.
    NOISED = "noised and charged"
    #: A code of the fixed set: public configuration, except that ``data-invalid`` depends on the
    #: site's own files (never on what the coordinator sends: the model is checked against public
    #: metadata first), so it is the same for a malformed dataset and its neighbours.
    CODE = "failure code, not noised"
    #: Sent by the coordinator (a request field: nothing of the site's).
    REQUEST = "coordinator request"


@dataclass(frozen=True)
class Field:
    """One key of a message record: its Flower value type and sensitivity."""

    key: str
    type: str
    sensitivity: Sensitivity
    description: str


@dataclass(frozen=True)
class Failure:
    """One failure a site may reply with: Flower ``Error(code=code, reason=name)``."""

    code: int
    name: str
    description: str


class Failures:
    """The fixed set of failure replies (numeric codes 4001-4008). A reply's reason is its name."""

    PACKAGE_REJECTED = Failure(
        4001,
        "package-rejected",
        "the package or request failed verification (signature, site, size, expiry, rollback, requested weights)",
    )
    MODEL_INCOMPATIBLE = Failure(
        4002,
        "model-incompatible",
        "the package's model does not fit the public "
        "data metadata of the site YAML (input shape, number of classes); "
        "checked before any record is read",
    )
    APP_REFUSED = Failure(
        4003, "app-refused", "the run's app is not the one installed on the device (agent/app_gate.py)"
    )
    APP_FAILED = Failure(4004, "app-failed", "the installed ClientApp raised (agent/app_gate.py)")
    DATA_INVALID = Failure(4005, "data-invalid", "the site's own records are unreadable or malformed")
    BUDGET_EXHAUSTED = Failure(
        4006,
        "budget-exhausted",
        "the site's privacy budget cannot pay for the "
        "request (train and evaluate answer with the budget-exhausted reply instead)",
    )
    REPLAYED = Failure(
        4007,
        "replayed",
        "the request's ledger key was already claimed: a replayed or duplicated message is never computed again",
    )
    INTERNAL_ERROR = Failure(
        4008, "internal-error", "anything else that went wrong on the site (configuration, build, ledger)"
    )

    @classmethod
    def all(cls) -> tuple[Failure, ...]:
        return tuple(v for v in vars(cls).values() if isinstance(v, Failure))

    @classmethod
    def by_code(cls, code: int) -> Failure | None:
        return next((f for f in cls.all() if f.code == code), None)


def failure_text(code: int) -> str:
    """What the coordinator records for a failure reply of ``code``: the name from the fixed set,
    or for Flower's own codes (a dead node, a crashed app) ``flower-<its name>``, else
    ``error-<code>``; never the reply's reason text (a site, or Flower relaying a site's exception,
    could put anything there)."""
    failure = Failures.by_code(code)
    if failure is not None:
        return failure.name
    from flwr.common.constant import ErrorCode

    names = {v: k for k, v in vars(ErrorCode).items() if not k.startswith("_") and isinstance(v, int)}
    return f"flower-{names[code].lower().replace('_', '-')}" if code in names else f"error-{int(code)}"


#: Record names of a round's messages.
CONFIG_RECORD, ARRAYS_RECORD, METRICS_RECORD = "config", "arrays", "metrics"

# request keys -------------------------------------------------------------------------------
ASK, SITE, PACKAGE, SERVER_ROUND = "ask", "site", "package", "server-round"
REPLY_KEYS = "reply-keys"
#: Flower's DifferentialPrivacyClientSideFixedClipping adds it to train messages (central DP).
CLIPPING_NORM = "clipping_norm"
#: Flower's FedProx adds it to train messages.
PROXIMAL_MU = "proximal-mu"

# reply metric keys ----------------------------------------------------------------------------
NUM_EXAMPLES, BUDGET_EXHAUSTED = "num-examples", "budget-exhausted"
EPS_SPENT, EPS_REMAINING, EPS_ROUND = "eps-spent", "eps-remaining", "eps-round"
NOISE_MULTIPLIER, LOCAL_DP = "noise-multiplier", "local-dp"
BUILD_SECONDS, VERIFY_SECONDS, PACKAGE_BYTES = "build-seconds", "verify-seconds", "package-bytes"
NOISY_CORRECT, NOISY_TOTAL, COUNT_NOISE_SCALE = "noisy-correct", "noisy-total", "count-noise-scale"

P, M, N, R = Sensitivity.PUBLIC, Sensitivity.MEASURED, Sensitivity.NOISED, Sensitivity.REQUEST

_LEDGER = (
    Field(EPS_SPENT, "float", P, "the ledger's total ε, of events planned from public configuration"),
    Field(EPS_REMAINING, "float", P, "the site's budget minus eps-spent"),
)


@dataclass(frozen=True)
class MessageSpec:
    """One request or reply: its name, Flower message type, and the fields of each record."""

    name: str
    message_type: str  # "query", "train" or "evaluate"
    direction: str  # "request" (coordinator -> site) or "reply" (site -> coordinator)
    records: Mapping[str, tuple[Field, ...]]

    def keys(self, record: str) -> tuple[str, ...]:
        return tuple(f.key for f in self.records.get(record, ()))

    def metrics(self, **values: object) -> dict:
        """The metrics record of this reply from ``values`` named by Python identifiers
        (``eps_spent`` for ``eps-spent``); every listed key exactly once.

        Raises:
            KeyError: a value the spec does not list, or a listed one missing.
        """
        expected = self.keys(METRICS_RECORD)
        given = {k.replace("_", "-"): v for k, v in values.items()}
        if set(given) != set(expected):
            raise KeyError(f"{self.name}: metrics {sorted(set(given) ^ set(expected))} differ from the protocol")
        return {k: given[k] for k in expected}


QUERY_REQUEST = MessageSpec(
    "query request",
    "query",
    "request",
    {CONFIG_RECORD: (Field(ASK, "str", R, "what the coordinator asks: the site's name"),)},
)
QUERY_REPLY = MessageSpec(
    "query reply", "query", "reply", {CONFIG_RECORD: (Field(SITE, "str", P, "the site's name, from its own YAML"),)}
)

_PACKAGE_REQUEST = (
    Field(SITE, "str", R, "the site the package is for"),
    Field(PACKAGE, "bytes", R, "the signed (and maybe sealed) package"),
    Field(SERVER_ROUND, "int", R, "the round number"),
)
TRAIN_REQUEST = MessageSpec(
    "train request",
    "train",
    "request",
    {
        CONFIG_RECORD: (
            *_PACKAGE_REQUEST,
            Field(REPLY_KEYS, "list[str]", R, "the weights the reply carries (none beside the package)"),
            Field(CLIPPING_NORM, "float", R, "central DP: the clipping norm of Flower's wrapper"),
            Field(PROXIMAL_MU, "float", R, "FedProx's mu"),
        ),
        ARRAYS_RECORD: (Field("<weight name>", "array", R, "under central DP: the weights the site starts from"),),
    },
)
TRAIN_REPLY = MessageSpec(
    "train reply",
    "train",
    "reply",
    {
        ARRAYS_RECORD: (Field("<weight name>", "array", N, "the trained weights (DP-SGD, charged per round)"),),
        METRICS_RECORD: (
            Field(NUM_EXAMPLES, "int", P, "the FedAvg weight: training.weight of the site YAML (1 under central DP)"),
            Field(EPS_ROUND, "float", P, "ε of this round, from the planned σ, q and steps"),
            *_LEDGER,
            Field(NOISE_MULTIPLIER, "float", P, "DP-SGD's σ, planned from the site YAML"),
            Field(LOCAL_DP, "int", P, "1 when the site trains with DP-SGD"),
            Field(BUILD_SECONDS, "float", M, "seconds to build the package for this device"),
            Field(VERIFY_SECONDS, "float", M, "seconds to verify the package"),
            Field(PACKAGE_BYTES, "int", P, "the package's size"),
            Field(BUDGET_EXHAUSTED, "int", P, "0"),
        ),
    },
)
EVALUATE_REQUEST = MessageSpec("evaluate request", "evaluate", "request", {CONFIG_RECORD: _PACKAGE_REQUEST})
EVALUATE_REPLY = MessageSpec(
    "evaluate reply",
    "evaluate",
    "reply",
    {
        METRICS_RECORD: (
            Field(NOISY_CORRECT, "int", N, "correct predictions + discrete Laplace noise (eval_epsilon)"),
            Field(NOISY_TOTAL, "int", N, "evaluation records + discrete Laplace noise (same release)"),
            Field(COUNT_NOISE_SCALE, "float", P, "the noise scale 2 / eval_epsilon"),
            *_LEDGER,
            Field(BUDGET_EXHAUSTED, "int", P, "0"),
        )
    },
)
EXHAUSTED_REPLY = MessageSpec(
    "budget-exhausted reply",
    "train or evaluate",
    "reply",
    {
        ARRAYS_RECORD: (Field("<weight name>", "array", P, "under central DP: the weights received, unchanged"),),
        METRICS_RECORD: (
            Field(NUM_EXAMPLES, "int", P, "0, or 1 under central DP"),
            *_LEDGER,
            Field(BUDGET_EXHAUSTED, "int", P, "1"),
        ),
    },
)
FAILURE_REPLY = MessageSpec(
    "failure reply",
    "any",
    "reply",
    {
        "error": (
            Field("code", "int", Sensitivity.CODE, "a code of the fixed set (Failures)"),
            Field("reason", "str", Sensitivity.CODE, "that code's name, nothing else"),
        )
    },
)

MESSAGES = (
    QUERY_REQUEST,
    QUERY_REPLY,
    TRAIN_REQUEST,
    TRAIN_REPLY,
    EVALUATE_REQUEST,
    EVALUATE_REPLY,
    EXHAUSTED_REPLY,
    FAILURE_REPLY,
)


def leaving_a_site() -> list[tuple[str, str, str, Field]]:
    """(message, record, key, field) of every value a site sends, in protocol order."""
    return [
        (m.name, record, f.key, f)
        for m in MESSAGES
        if m.direction == "reply"
        for record, fields in m.records.items()
        for f in fields
    ]


def privacy_table() -> str:
    """The markdown table of what leaves a site (docs/PRIVACY.md keeps it; a test compares)."""
    rows = ["| reply | record | key | type | sensitivity |", "|---|---|---|---|---|"]
    rows += [f"| {m} | {r} | `{k}` | {f.type} | {f.sensitivity.value} |" for m, r, k, f in leaving_a_site()]
    return "\n".join(rows)


def failure_table() -> str:
    """The markdown table of the failure codes."""
    rows = ["| code | reason | when |", "|---|---|---|"]
    rows += [f"| {f.code} | `{f.name}` | {f.description} |" for f in Failures.all()]
    return "\n".join(rows)
