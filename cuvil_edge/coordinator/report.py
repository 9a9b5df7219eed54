"""Round reports: a text table per round, metrics JSON and a PNG plot per run.

Up to :data:`TABLE_MAX_SITES` sites the round shows one line per site and the plot one line per
site; beyond that both summarise (counts by status, ε min / median / max, the slowest sites, the
first errors; distributions in the plot). metrics.json always keeps every site's statistics.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TypeGuard

from cuvil_edge.config.site import SiteConfig

log = logging.getLogger(__name__)

#: Status of a site whose ledger refused the round (set by coordinator.strategy).
EXHAUSTED_STATUS = "budget exhausted"
#: Status of a site that replied with an error or not at all (its reason is kept as <phase>-error).
FAILED_STATUS = "failed"
#: The site's compile plan does not fit its limits: the coordinator sends it nothing.
NOT_PUSHED_STATUS = "not pushed"

#: metrics.json ``stopped_early.reason`` when central DP's ``max_epsilon`` ended the run
#: before the requested rounds (the launcher accepts such a run as complete).
STOPPED_CENTRAL_BUDGET = "stopped early: central ε budget"

#: More sites than this: the round table and the plot summarise instead of one line per site.
TABLE_MAX_SITES = 10
#: How many of the slowest sites and of the errors a summarised round names.
SLOWEST_SHOWN, ERRORS_SHOWN = 5, 5
#: Reply fields (seconds) that make up a site's train time, as far as the site reports them.
TRAIN_SECONDS = ("train-verify-seconds", "train-build-seconds", "train-train-seconds")


def show_round_table() -> None:
    """Print each round's table, and cuvil-edge's errors, on this process's stdout, once however often
    called: Flower streams the ServerApp process's stdout to `flwr run --stream`, so the demo and
    `cuvil-edge run` show it. Each line is marked as ours (coordinator/flwr_stream.py), so they can
    show it without Flower's own log."""
    import sys

    from cuvil_edge.coordinator.flwr_stream import MarkedFormatter

    if any(getattr(h, "_cuvil_round_table", False) for h in log.handlers):
        return
    # the report, every line; cuvil-edge's other warnings plain (Flower's log shows them with
    # --verbose) and its errors marked
    for logger, level, formatter in (
        (log, logging.INFO, MarkedFormatter()),
        (
            logging.getLogger("cuvil_edge"),
            logging.WARNING,
            MarkedFormatter(marked_level=logging.ERROR, marked_prefix="error: "),
        ),
    ):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(formatter)
        handler.setLevel(level)
        handler._cuvil_round_table = True  # type: ignore[attr-defined]  # marks the handlers this module added
        logger.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


class RunReport:
    """Collects global accuracy and per-site statistics round by round."""

    def __init__(self, run_dir: Path, sites: Sequence[SiteConfig]) -> None:
        self.run_dir = run_dir
        self.sites = list(sites)
        self.rounds: list[dict] = []
        self.stopped_early: dict | None = None
        self._last = time.monotonic()

    def add_round(
        self,
        server_round: int,
        accuracy: float,
        site_stats: dict[str, dict],
        central: dict | None = None,
        federated: dict | None = None,
        timings: dict | None = None,
        initial: bool = False,
    ) -> dict:
        """Record one round; ``central`` is the central-DP accounting (None without central DP),
        ``federated`` the accuracy pooled from the sites' noisy counts with its 95 % interval,
        ``timings`` the coordinator's seconds per phase; ``seconds`` is the round's wall time.
        ``initial``: the model this run starts from, evaluated before any site is asked (round 0,
        or the checkpoint's round of a resumed run): no site table."""
        now = time.monotonic()
        sites = {s.site: {"target": s.target, **site_stats.get(s.site, {})} for s in self.sites}
        entry = {
            "round": server_round,
            "global_accuracy": accuracy,
            "sites": sites,
            "dropped_out": sorted(k for k, v in sites.items() if v.get("status") == EXHAUSTED_STATUS),
            "seconds": round(now - self._last, 3),
            **({"coordinator": timings} if timings else {}),
        }
        self._last = now
        if initial:
            entry["initial"] = True
        if federated is not None:
            entry["federated_accuracy"] = federated
        if central is not None:
            entry["central_dp"] = central
        self.rounds.append(entry)
        log.info("%s", format_round(entry))
        self.write_json()
        return entry

    def stop_early(self, reason: str, detail: str, *, requested_rounds: int) -> dict:
        """Record that the run ended cleanly before ``requested_rounds`` (e.g. :data:`STOPPED_CENTRAL_BUDGET`)."""
        completed = max((r["round"] for r in self.rounds), default=0)
        self.stopped_early = {
            "reason": reason,
            "detail": detail,
            "completed_rounds": completed,
            "requested_rounds": requested_rounds,
        }
        log.warning("%s", format_stop(self.stopped_early))
        self.write_json()
        return self.stopped_early

    def no_site_trained(self) -> str | None:
        """None if some site trained in some round of this run; else one line naming each site and
        why (its last round's error or status). A run with no training round yet is None."""
        trained = [r for r in self.rounds if r["round"] > 0 and not r.get("initial")]
        if not trained or any(s.get("status") == "ok" for r in trained for s in r["sites"].values()):
            return None
        last = trained[-1]["sites"]
        why = [
            f"{site}: {s.get('train-error') or s.get('eval-error') or s.get('status', 'no reply')}"
            for site, s in last.items()
        ]
        return "no site trained in any round: " + ", ".join(why)

    def write_json(self) -> Path:
        path = self.run_dir / "metrics.json"
        tmp = path.with_suffix(".json.tmp")
        data: dict = {"rounds": self.rounds}
        if self.stopped_early is not None:
            data["stopped_early"] = self.stopped_early
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
        tmp.replace(path)
        return path

    def plot(self) -> Path:
        """Accuracy and ε spent by round, as a PNG beside metrics.json: one line per site up to
        :data:`TABLE_MAX_SITES` sites, distributions beyond (:func:`_plot_many`)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        many = len(self.sites) > TABLE_MAX_SITES
        fig, axes = plt.subplots(1, 3 if many else 2, figsize=(15 if many else 10, 4))
        ax_acc, ax_eps = axes[0], axes[1]
        rounds = [r["round"] for r in self.rounds]
        ax_acc.plot(rounds, [r["global_accuracy"] for r in self.rounds], marker="o", label="global (test set)")
        ax_acc.set(title="Global test accuracy", xlabel="round", ylabel="accuracy", ylim=(0, 1))
        if many:
            _plot_many(self.rounds, ax_acc, ax_eps, axes[2])
        else:
            for site in self.sites:
                eps = [r["sites"][site.site].get("eps-spent", 0.0) for r in self.rounds]
                ax_eps.plot(rounds, eps, marker="o", label=f"{site.site} ({site.target})")
        central = [
            (r["round"], r["central_dp"]["epsilon"])
            for r in self.rounds
            if r.get("central_dp", {}).get("epsilon") is not None
        ]
        if central:
            ax_eps.plot(*zip(*central, strict=True), marker="s", color="black", label="central ε (site-level)")
        budgets = sorted({s.privacy.epsilon_budget for s in self.sites})
        ax_eps.axhline(budgets[-1], color="grey", linestyle="--", label="budget")
        if len(budgets) > 1:
            ax_eps.axhline(budgets[0], color="grey", linestyle=":", label="smallest budget")
        ax_eps.set(title="ε spent per site", xlabel="round", ylabel="ε (δ per site config)")
        ax_eps.legend(fontsize=8)
        if many:
            ax_acc.legend(fontsize=8)
        if self.stopped_early is not None:
            fig.suptitle(
                f"{self.stopped_early['reason']} (after round {self.stopped_early['completed_rounds']} "
                f"of {self.stopped_early['requested_rounds']})",
                fontsize=9,
            )
        fig.tight_layout()
        path = self.run_dir / "metrics.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def _plot_many(rounds: list[dict], ax_acc, ax_eps, ax_status) -> None:
    """Distributions over many sites: ε spent as a min–max band with the interquartile band and
    the median; the sites' local accuracies as a box per round beside the pooled accuracy; the
    number of sites by status per round as stacked bars."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    rounds = [r for r in rounds if any("status" in s for s in r["sites"].values())]  # the first: nothing sent yet
    xs = [r["round"] for r in rounds]
    eps = [[v for v in (s.get("eps-spent") for s in r["sites"].values()) if v is not None] for r in rounds]
    q = np.array([np.percentile(e, [0, 25, 50, 75, 100]) if e else [np.nan] * 5 for e in eps])
    ax_eps.fill_between(xs, q[:, 0], q[:, 4], alpha=0.2, color="tab:blue", label="min–max over sites")
    ax_eps.fill_between(xs, q[:, 1], q[:, 3], alpha=0.35, color="tab:blue", label="middle half")
    ax_eps.plot(xs, q[:, 2], marker="o", color="tab:blue", label="median site")
    fed = [(r["round"], r["federated_accuracy"]) for r in rounds if _estimable(r.get("federated_accuracy"))]
    if fed:
        ax_acc.errorbar(
            [x for x, _ in fed],
            [f["accuracy"] for _, f in fed],
            yerr=[[f["accuracy"] - f["low"] for _, f in fed], [f["high"] - f["accuracy"] for _, f in fed]],
            marker="s",
            capsize=3,
            label="sites pooled (95 %)",
        )
    local = [
        (r["round"], [v for v in (s.get("eval-accuracy") for s in r["sites"].values()) if v is not None and v == v])
        for r in rounds
    ]
    local = [(x, v) for x, v in local if v]
    if local:
        ax_acc.boxplot(
            [v for _, v in local], positions=[x for x, _ in local], widths=0.4, manage_ticks=False, showfliers=False
        )
        ax_acc.set_title("Accuracy (boxes: the sites' local accuracy*)")
    counts = [_status_counts(r["sites"]) for r in rounds]
    bottom = np.zeros(len(xs))
    for status in _STATUS_ORDER:
        heights = np.array([c.get(status, 0) for c in counts], dtype=float)
        if heights.any():
            ax_status.bar(xs, heights, bottom=bottom, label=status)
            bottom += heights
    ax_status.set(title="Sites by status", xlabel="round", ylabel="sites")
    ax_status.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for ax in (ax_acc, ax_eps, ax_status):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def format_stop(stopped: dict) -> str:
    """One line saying why and when a run ended before its requested rounds."""
    return (
        f"{stopped['reason']}: the run ends after round {stopped['completed_rounds']} of "
        f"{stopped['requested_rounds']} ({stopped['detail']})"
    )


def format_round(entry: dict) -> str:
    """The text report of one round: one line per site up to :data:`TABLE_MAX_SITES` sites, a
    summary beyond."""
    head = f"round {entry['round']}: global test accuracy {entry['global_accuracy']:.4f}"
    head += _pooled_text(entry)
    if not entry["sites"] or entry["round"] == 0 or entry.get("initial"):
        return head + (" (the checkpoint this run resumes from)" if entry.get("initial") and entry["round"] else "")
    many = len(entry["sites"]) > TABLE_MAX_SITES
    lines = [head, *(_site_summary(entry) if many else _site_table(entry))]
    central = entry.get("central_dp")
    if central is not None:
        eps = central.get("epsilon")
        shown = "no accountant" if eps is None else f"ε = {eps:.3f} at δ = {central['delta']:g}"
        lines.append(
            f"  central DP (site-level, σ={central['noise_multiplier']:g}, clip {central['clipping_norm']:g}): "
            f"{shown}" + ("" if central.get("released") else " (no aggregate released this round)")
        )
    lines.append(
        "  * local accuracy = the site's noisy correct / noisy total (discrete Laplace, eval_epsilon), "
        "clipped to [0, 1]"
    )
    return "\n".join(lines)


def _estimable(fed: dict | None) -> TypeGuard[dict]:
    """Whether a pooled result has an informative interval (older entries carry no flag)."""
    return fed is not None and fed.get("estimable", True)


def _pooled_text(entry: dict) -> str:
    """The pooled accuracy with its 95 % interval, or "not estimable" where the DP noise is
    comparable to the totals (``coordinator/evaluation.py``: never an interval of [0, 1])."""
    fed = entry.get("federated_accuracy")
    if _estimable(fed):
        return (
            f"; sites' pooled accuracy {fed['accuracy']:.3f} (95 % interval {fed['low']:.3f}–{fed['high']:.3f}, "
            f"noisy n={fed['noisy_total']})"
        )
    if fed is not None:
        return f"; sites' pooled accuracy not estimable (DP noise comparable to the noisy n={fed['noisy_total']})"
    if any("eval-noisy-total" in s for s in entry.get("sites", {}).values()):
        return "; sites' pooled accuracy not estimable (noisy total <= 0)"
    return ""


def _site_table(entry: dict) -> list[str]:
    """One fixed-width line per site, then each site's errors and who dropped out."""
    cols = (
        f"  {'site':<14}{'target':<18}{'prec':<6}{'status':<18}"
        f"{'ε spent':>9}{'ε left':>9}{'pkg KiB':>9}{'build ms':>10}{'local acc*':>11}"
    )
    lines = [cols]
    for site, s in entry["sites"].items():
        lines.append(
            f"  {site:<14}{s['target']:<18}{s.get('precision', 'fp32'):<6}{s.get('status', 'no reply'):<18}"
            f"{s.get('eps-spent', float('nan')):>9.3f}{s.get('eps-remaining', float('nan')):>9.3f}"
            f"{s.get('package-bytes', 0) / 1024:>9.1f}{1000 * s.get('train-build-seconds', float('nan')):>10.1f}"
            f"{s.get('eval-accuracy', float('nan')):>11.3f}"
        )
    lines += [f"  ! {site} failed ({phase}): {error[:160]}" for site, phase, error in _errors(entry["sites"])]
    if entry.get("dropped_out"):
        lines.append(
            f"  ! {', '.join(entry['dropped_out'])}: privacy budget exhausted; left out of this round's "
            "average (the run goes on with the others)"
        )
    return lines


_STATUS_ORDER = ("ok", FAILED_STATUS, EXHAUSTED_STATUS, NOT_PUSHED_STATUS, "no reply")


def _status_counts(sites: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in sites.values():
        status = s.get("status", "no reply")
        counts[status] = counts.get(status, 0) + 1
    return counts


def _errors(sites: dict[str, dict]) -> list[tuple[str, str, str]]:
    """(site, phase, reason) of every failure, in site order."""
    return [
        (site, phase, str(s[f"{phase}-error"]))
        for site, s in sites.items()
        for phase in ("train", "eval")
        if s.get(f"{phase}-error")
    ]


def _spread(values: list[float], fmt: str = ".3f") -> str:
    """min / median / max of the finite values, or "n/a"."""
    import statistics

    finite = sorted(v for v in values if v is not None and v == v and abs(v) != float("inf"))
    if not finite:
        return "n/a"
    return f"min {finite[0]:{fmt}}  median {statistics.median(finite):{fmt}}  max {finite[-1]:{fmt}}"


def _names(names: list[str], shown: int = 10) -> str:
    return ", ".join(names[:shown]) + (f" (+{len(names) - shown} more)" if len(names) > shown else "")


def _site_summary(entry: dict) -> list[str]:
    """Many sites: counts by status, ε spent and local accuracy spread, precisions, the slowest
    sites by train time (verify + build + train, as far as reported) and the first errors."""
    sites = entry["sites"]
    counts = _status_counts(sites)
    shown = ", ".join(
        f"{counts.get(k, 0)} {'out of budget' if k == EXHAUSTED_STATUS else k}"
        for k in _STATUS_ORDER
        if k in counts or k != "no reply"
    )
    lines = [f"  {len(sites)} sites: {shown}"]
    lines.append(f"  ε spent:     {_spread([s.get('eps-spent') for s in sites.values()])}")
    lines.append(f"  ε left:      {_spread([s.get('eps-remaining') for s in sites.values()])}")
    lines.append(f"  local acc*:  {_spread([s.get('eval-accuracy') for s in sites.values()])}")
    precisions: dict[str, int] = {}
    for s in sites.values():
        if "precision" in s:
            precisions[s["precision"]] = precisions.get(s["precision"], 0) + 1
    if precisions:
        lines.append("  precision:   " + ", ".join(f"{n} {p}" for p, n in sorted(precisions.items())))
    timed = sorted(
        (
            (sum(s.get(k, 0.0) for k in TRAIN_SECONDS), site, s)
            for site, s in sites.items()
            if any(k in s for k in TRAIN_SECONDS)
        ),
        key=lambda t: (-t[0], t[1]),
    )
    if timed:
        lines.append(
            f"  slowest ({' + '.join(k.removeprefix('train-').removesuffix('-seconds') for k in TRAIN_SECONDS)}"
            f", as reported):"
        )
        lines += [
            f"    {site:<20}{total:>8.2f} s  ({s['target']}, {s.get('precision', 'fp32')})"
            for total, site, s in timed[:SLOWEST_SHOWN]
        ]
    errors = _errors(sites)
    if errors:
        lines.append(f"  ! {len(errors)} failure(s); the first {min(len(errors), ERRORS_SHOWN)}:")
        lines += [f"  ! {site} failed ({phase}): {error[:160]}" for site, phase, error in errors[:ERRORS_SHOWN]]
    if entry.get("dropped_out"):
        lines.append(
            f"  ! {len(entry['dropped_out'])} site(s) out of privacy budget, left out of this round's "
            f"average (the run goes on with the others): {_names(entry['dropped_out'])}"
        )
    return lines
