"""The round report for many sites: above ten sites the table and the plot summarise; metrics.json keeps all."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.config import load_site
from cuvil_edge.coordinator.report import (EXHAUSTED_STATUS, FAILED_STATUS, NOT_PUSHED_STATUS, TABLE_MAX_SITES,
                                           RunReport, format_round)

SITE = Path(__file__).resolve().parents[2] / "configs" / "sites" / "hospital-a.yaml"


def _sites(n: int):
    base = load_site(SITE)
    return [base.model_copy(update={"site": f"site-{i:03d}"}) for i in range(n)]


def _stats(n: int, server_round: int, seed: int = 0) -> dict[str, dict]:
    """n synthetic site entries: 3 failed (train), 4 out of budget, 1 not pushed, 2 silent, the rest ok."""
    rng = np.random.default_rng(seed + server_round)
    stats = {}
    for i in range(n):
        site = f"site-{i:03d}"
        eps = float(rng.uniform(0.5, 3.0) * server_round)
        s = {"status": "ok", "eps-spent": eps, "eps-remaining": 8.0 - eps, "precision": "fp32" if i % 10 else "int8",
             "package-bytes": 60_000, "train-verify-seconds": 0.01, "train-build-seconds": 0.05 + i / 1000,
             "eval-accuracy": float(rng.uniform(0.5, 1.0))}
        if i in (7, 8, 9):
            s.update(status=FAILED_STATUS, **{"train-error": f"PackageSignatureError: bad signature at node {i}"})
        elif i in (20, 21, 22, 23):
            s.update(status=EXHAUSTED_STATUS)
        elif i == 30:
            s = {"status": NOT_PUSHED_STATUS, "train-error": "not pushed: its plan does not fit limits.memory_mb"}
        elif i in (40, 41):
            s = {}  # no reply recorded at all
        stats[site] = s
    if "site-099" in stats:
        stats["site-099"]["train-build-seconds"] = 9.5  # the slowest by far
    return stats


def test_more_than_ten_sites_are_summarised_not_listed():
    n = 100
    sites = {f"site-{i:03d}": {"target": "jetson-orin-nano", **s} for i, s in enumerate(_stats(n, 2).values())}
    entry = {"round": 2, "global_accuracy": 0.91, "sites": sites,
             "dropped_out": [f"site-{i:03d}" for i in (20, 21, 22, 23)],
             "federated_accuracy": {"accuracy": 0.9, "low": 0.88, "high": 0.92, "noisy_total": 3000, "sites": 97}}
    text = format_round(entry)
    lines = text.splitlines()
    assert len(lines) < 30, text  # not one line per site
    assert "100 sites: 90 ok, 3 failed, 4 out of budget, 1 not pushed, 2 no reply" in text
    eps = [s["eps-spent"] for s in sites.values() if "eps-spent" in s]
    assert f"min {min(eps):.3f}  median {statistics.median(eps):.3f}  max {max(eps):.3f}" in text
    assert "89 fp32, 8 int8" in text
    slow = text[text.index("slowest"):].splitlines()
    assert "site-099" in slow[1] and "9.51 s" in slow[1]  # 0.01 verify + 9.5 build (no train time reported)
    assert "site-098" in slow[2]
    assert "4 failure(s); the first 4" in text and "site-007 failed (train): PackageSignatureError" in text
    assert "site-030 failed (train): not pushed" in text
    assert "4 site(s) out of privacy budget" in text and "site-020, site-021, site-022, site-023" in text
    assert "pooled accuracy 0.900" in text


def test_ten_sites_keep_the_table_with_one_line_per_site():
    stats = _stats(TABLE_MAX_SITES, 1)
    sites = {s: {"target": "jetson-orin-nano", **v} for s, v in stats.items()}
    text = format_round({"round": 1, "global_accuracy": 0.5, "sites": sites, "dropped_out": []})
    assert all(any(line.startswith(f"  {site} ") for line in text.splitlines()) for site in sites)
    assert "sites:" not in text and "site-007 failed (train)" in text


def test_many_sites_plot_distributions_and_metrics_json_keeps_every_site(tmp_path):
    n = 100
    report = RunReport(tmp_path, _sites(n))
    report.add_round(0, 0.1, {})
    for r in (1, 2, 3):
        report.add_round(r, 0.5 + r / 10, _stats(n, r),
                         federated={"accuracy": 0.6, "low": 0.55, "high": 0.65, "noisy_total": 2000, "sites": 95},
                         central=None)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert [len(r["sites"]) for r in metrics["rounds"]] == [n] * 4
    assert metrics["rounds"][2]["sites"]["site-007"]["train-error"].startswith("PackageSignatureError")
    assert metrics["rounds"][3]["sites"]["site-050"]["eps-spent"] == pytest.approx(_stats(n, 3)["site-050"]["eps-spent"])
    path = report.plot()
    import matplotlib.image

    image = matplotlib.image.imread(path)
    assert image.shape[1] == 1500  # three panels (accuracy, ε distribution, sites by status), not 100 legend lines
    few = RunReport(tmp_path / "few", _sites(3))
    (tmp_path / "few").mkdir()
    few.add_round(0, 0.1, {})
    few.add_round(1, 0.5, {s: v for s, v in list(_stats(3, 1).items())})
    assert matplotlib.image.imread(few.plot()).shape[1] == 1000  # one line per site, as before
