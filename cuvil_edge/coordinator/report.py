"""Round reports: a text table per round, metrics JSON and a PNG plot per run."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

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


def show_round_table() -> None:
    """Print each round's table on this process's stdout, once however often called: Flower streams
    the ServerApp process's stdout to `flwr run --stream`, so the demo and `cuvil-edge run` show it."""
    import sys

    if any(getattr(h, "_cuvil_round_table", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler._cuvil_round_table = True
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    log.propagate = False


class RunReport:
    """Collects global accuracy and per-site statistics round by round."""

    def __init__(self, run_dir: Path, sites: Sequence[SiteConfig]) -> None:
        self.run_dir = run_dir
        self.sites = list(sites)
        self.rounds: list[dict] = []
        self.stopped_early: dict | None = None

    def add_round(self, server_round: int, accuracy: float, site_stats: dict[str, dict],
                  central: dict | None = None, federated: dict | None = None) -> dict:
        """Record one round; ``central`` is the central-DP accounting (None without central DP),
        ``federated`` the accuracy pooled from the sites' noisy counts with its 95 % interval."""
        sites = {s.site: {"target": s.target, **site_stats.get(s.site, {})} for s in self.sites}
        entry = {"round": server_round, "global_accuracy": accuracy, "sites": sites,
                 "dropped_out": sorted(k for k, v in sites.items() if v.get("status") == EXHAUSTED_STATUS)}
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
        self.stopped_early = {"reason": reason, "detail": detail, "completed_rounds": completed,
                              "requested_rounds": requested_rounds}
        log.warning("%s", format_stop(self.stopped_early))
        self.write_json()
        return self.stopped_early

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
        """Accuracy and per-site ε spent by round, as a PNG beside metrics.json."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rounds = [r["round"] for r in self.rounds]
        fig, (ax_acc, ax_eps) = plt.subplots(1, 2, figsize=(10, 4))
        ax_acc.plot(rounds, [r["global_accuracy"] for r in self.rounds], marker="o")
        ax_acc.set(title="Global test accuracy", xlabel="round", ylabel="accuracy", ylim=(0, 1))
        for site in self.sites:
            eps = [r["sites"][site.site].get("eps-spent", 0.0) for r in self.rounds]
            ax_eps.plot(rounds, eps, marker="o", label=f"{site.site} ({site.target})")
        central = [(r["round"], r["central_dp"]["epsilon"]) for r in self.rounds
                   if r.get("central_dp", {}).get("epsilon") is not None]
        if central:
            ax_eps.plot(*zip(*central), marker="s", color="black", label="central ε (site-level)")
        budget = max(s.privacy.epsilon_budget for s in self.sites)
        ax_eps.axhline(budget, color="grey", linestyle="--", label="budget")
        ax_eps.set(title="ε spent per site", xlabel="round", ylabel="ε (δ per site config)")
        ax_eps.legend(fontsize=8)
        if self.stopped_early is not None:
            fig.suptitle(f"{self.stopped_early['reason']} (after round {self.stopped_early['completed_rounds']} "
                         f"of {self.stopped_early['requested_rounds']})", fontsize=9)
        fig.tight_layout()
        path = self.run_dir / "metrics.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def format_stop(stopped: dict) -> str:
    """One line saying why and when a run ended before its requested rounds."""
    return (f"{stopped['reason']}: the run ends after round {stopped['completed_rounds']} of "
            f"{stopped['requested_rounds']} ({stopped['detail']})")


def format_round(entry: dict) -> str:
    """A fixed-width text table of one round."""
    head = f"round {entry['round']}: global test accuracy {entry['global_accuracy']:.4f}"
    fed = entry.get("federated_accuracy")
    if fed is not None:
        head += (f"; sites' pooled accuracy {fed['accuracy']:.3f} (95 % interval {fed['low']:.3f}–{fed['high']:.3f}, "
                 f"noisy n={fed['noisy_total']})")
    if not entry["sites"] or entry["round"] == 0:
        return head
    cols = f"  {'site':<14}{'target':<18}{'prec':<6}{'status':<18}{'ε spent':>9}{'ε left':>9}{'pkg KiB':>9}{'build ms':>10}{'local acc*':>11}"
    lines = [head, cols]
    for site, s in entry["sites"].items():
        lines.append(
            f"  {site:<14}{s['target']:<18}{s.get('precision', 'fp32'):<6}{s.get('status', 'no reply'):<18}"
            f"{s.get('eps-spent', float('nan')):>9.3f}{s.get('eps-remaining', float('nan')):>9.3f}"
            f"{s.get('package-bytes', 0) / 1024:>9.1f}{1000 * s.get('train-build-seconds', float('nan')):>10.1f}"
            f"{s.get('eval-accuracy', float('nan')):>11.3f}"
        )
    for site, s in entry["sites"].items():
        for phase in ("train", "eval"):
            if s.get(f"{phase}-error"):
                lines.append(f"  ! {site} failed ({phase}): {str(s[f'{phase}-error'])[:160]}")
    if entry.get("dropped_out"):
        lines.append(f"  ! {', '.join(entry['dropped_out'])}: privacy budget exhausted; left out of this round's "
                     "average (the run goes on with the others)")
    central = entry.get("central_dp")
    if central is not None:
        eps = central.get("epsilon")
        shown = "no accountant" if eps is None else f"ε = {eps:.3f} at δ = {central['delta']:g}"
        lines.append(f"  central DP (site-level, σ={central['noise_multiplier']:g}, clip {central['clipping_norm']:g}): "
                     f"{shown}" + ("" if central.get("released") else " (no aggregate released this round)"))
    lines.append("  * local accuracy = the site's noisy correct / noisy total (discrete Laplace, eval_epsilon), "
                 "clipped to [0, 1]")
    return "\n".join(lines)
