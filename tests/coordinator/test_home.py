"""One durable home per federation: runs reuse its keys, counters and site state (never per run)."""

from __future__ import annotations

from pathlib import Path

from cuvil_edge.config import load_site
from cuvil_edge.config.home import site_state_dir
from cuvil_edge.coordinator.launcher import prepare_run

ROOT = Path(__file__).resolve().parents[2]


def test_two_runs_share_the_homes_keys_and_site_state(tmp_path):
    fed = ROOT / "configs" / "federation.yaml"
    first = prepare_run(fed, tmp_path / "run1", home=tmp_path / "home")
    root_json = Path(first.trust_root).read_bytes()
    second = prepare_run(fed, tmp_path / "run2", home=tmp_path / "home")
    assert second.home == first.home and second.run_dir != first.run_dir
    assert Path(second.trust_root).read_bytes() == root_json  # no fresh keys per run
    site = load_site(ROOT / "configs" / "sites" / "hospital-a.yaml")
    assert site_state_dir(site, Path(second.home)) == tmp_path / "home" / "agents" / "hospital-a"


def test_a_sites_own_state_dir_wins_over_the_home(tmp_path):
    text = (ROOT / "configs" / "sites" / "hospital-a.yaml").read_text() + "agent:\n  state_dir: mine\n"
    (tmp_path / "site.yaml").write_text(text)
    site = load_site(tmp_path / "site.yaml")
    assert site_state_dir(site, tmp_path / "home") == (tmp_path / "mine").resolve()
