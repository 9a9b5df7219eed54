"""Every path a YAML file names is taken relative to that file, never to the working directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from cuvil_edge.config import load_federation, load_site

REPO = Path(__file__).resolve().parents[2]

SITE = """\
site: hospital-a
target: rpi4
privacy:
  epsilon_budget: 8.0
  epsilon_per_round: 2.0
"""

FEDERATION = """\
name: paths
rounds: 1
model: {model}
sites:
  - {site}
dataset:
  test:
    kind: csv
    path: {test}
    label_column: y
quantization:
  calibration: {calibration}
"""


def _federation(folder: Path, **paths: str) -> Path:
    """A federation file in ``folder`` naming the given paths (defaults: relative ones)."""
    names = {"model": "models/m.onnx", "site": "sites/a.yaml", "test": "data/test.csv",
             "calibration": "cal/samples.npz", **paths}
    for name in ("model", "calibration"):  # the loader checks these exist
        target = folder / Path(names[name]).expanduser()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"x")
    path = folder / "federation.yaml"
    path.write_text(FEDERATION.format(**names))
    return path


#: (what the federation file says, how to read it back, where it points below the file's folder)
FEDERATION_KEYS = [
    ("model", lambda f: Path(f.model), "models/m.onnx"),
    ("sites", lambda f: f.sites[0], "sites/a.yaml"),
    ("dataset.test.path", lambda f: f.dataset.test.path, "data/test.csv"),
    ("quantization.calibration", lambda f: f.quantization.calibration, "cal/samples.npz"),
]


@pytest.mark.parametrize("key, read, below", FEDERATION_KEYS, ids=[k for k, _, _ in FEDERATION_KEYS])
def test_a_federation_path_is_relative_to_the_federation_file(tmp_path, monkeypatch, key, read, below):
    folder = tmp_path / "configs"
    folder.mkdir()
    path = _federation(folder)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)

    by_absolute = read(load_federation(path))
    by_relative = read(load_federation(Path("..") / "configs" / "federation.yaml"))

    assert by_absolute == by_relative == (folder / below).resolve()


def test_absolute_and_home_federation_paths_are_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    folder = tmp_path / "configs"
    folder.mkdir()
    data = tmp_path / "data" / "test.csv"
    path = _federation(folder, model=str(tmp_path / "m.onnx"), site=str(tmp_path / "s.yaml"),
                       test=str(data), calibration="~/cal.npz")
    monkeypatch.chdir(tmp_path / "user")

    fed = load_federation(path)

    assert Path(fed.model) == tmp_path / "m.onnx" and fed.sites == [tmp_path / "s.yaml"]
    assert fed.dataset.test.path == data and fed.quantization.calibration == tmp_path / "user" / "cal.npz"


SITE_KEYS = [
    ("data.path", "data:\n  kind: npz\n  path: {}\n", lambda s: s.data.path),
    ("agent.state_dir", "agent:\n  state_dir: {}\n", lambda s: s.agent.state_dir),
    ("agent.trust_root", "agent:\n  trust_root: {}\n", lambda s: s.agent.trust_root),
]


@pytest.mark.parametrize("key, section, read", SITE_KEYS, ids=[k for k, _, _ in SITE_KEYS])
def test_a_site_path_is_relative_to_the_site_file(tmp_path, monkeypatch, key, section, read):
    folder = tmp_path / "configs" / "sites"
    folder.mkdir(parents=True)
    path = folder / "a.yaml"
    path.write_text(SITE + section.format("../records/thing"))
    (folder / "abs.yaml").write_text(SITE + section.format(tmp_path / "fixed"))
    (folder / "home.yaml").write_text(SITE + section.format("~/thing"))
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.chdir(tmp_path)

    assert read(load_site(path)) == read(load_site("configs/sites/a.yaml")) == tmp_path / "configs" / "records" / "thing"
    assert read(load_site(folder / "abs.yaml")) == tmp_path / "fixed"
    assert read(load_site(folder / "home.yaml")) == tmp_path / "user" / "thing"


def test_the_shipped_demo_federation_loads_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    fed = load_federation(REPO / "configs" / "federation.yaml")
    sites = fed.load_sites()

    assert fed.sites == [REPO / "configs" / "sites" / f"{n}.yaml" for n in ("hospital-a", "factory-b", "fleet-c")]
    assert [s.site for s in sites] == ["hospital-a", "factory-b", "fleet-c"]
    assert not list(tmp_path.iterdir())  # nothing was looked for, or made, in the working directory


def test_the_shipped_example_points_at_its_own_files_from_any_directory(tmp_path, monkeypatch):
    example = REPO / "configs" / "examples" / "breast-cancer"
    monkeypatch.chdir(tmp_path)

    fed = load_federation(example / "federation.yaml")
    sites = fed.load_sites()

    assert Path(fed.model) == example / "mlp.onnx" and fed.dataset.test.path == example / "data" / "test.csv"
    assert [s.data.path for s in sites] == [example / "data" / f"hospital-{i}.csv" for i in (1, 2, 3)]
    assert all(p.is_file() for p in [Path(fed.model), fed.dataset.test.path, *(s.data.path for s in sites)])


def test_run_checks_the_federation_and_its_sites_before_submitting(tmp_path, monkeypatch, capsys):
    from cuvil_edge.cli.main import main
    from cuvil_edge.coordinator import superlink

    submitted = []
    monkeypatch.setattr(superlink, "submit_run", lambda home, app, fed, *a, **k: submitted.append(fed) or "done")
    from cuvil_edge.coordinator import preflight

    monkeypatch.setattr(preflight, "wait_for_sites", lambda *a, **k: ())  # no SuperLink here
    (tmp_path / "configs" / "sites").mkdir(parents=True)
    (tmp_path / "configs" / "federation.yaml").write_text(
        "name: f\nrounds: 1\nmodel: builtin:digits-cnn\nsites: [sites/a.yaml]\n")
    monkeypatch.chdir(tmp_path)

    missing = main(["run", "--home", "h"])  # the default configs/federation.yaml, from this directory
    err = capsys.readouterr().err
    (tmp_path / "configs" / "sites" / "a.yaml").write_text(SITE)
    found = main(["run", "--home", "h"])

    assert missing == 2 and f"{tmp_path / 'configs' / 'sites' / 'a.yaml'}: file not found" in err
    assert found == 0 and submitted == [Path("configs/federation.yaml")] and not (tmp_path / "h").exists()
