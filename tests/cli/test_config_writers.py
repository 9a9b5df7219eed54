"""The commands that write a site's and a federation's YAML (`agent new-site`, `coordinator
federation`, `coordinator demo-data`): what they write loads, names the records the device
holds, lists exactly the enrolled sites, and nothing is overwritten or half-written."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest

from cuvil_edge.cli.main import main
from cuvil_edge.config import load_federation, load_site
from cuvil_edge.config.enrollment import Enrollment
from cuvil_edge.coordinator.registry import SiteRegistry, init_home
from cuvil_edge.datasets.site_files import load_records
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.frontend.onnx_import import load_model


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_new_site_from_an_npz_loads_and_reads_the_device_records(workdir, capsys):
    rng = np.random.default_rng(0)
    (workdir / "records").mkdir()
    np.savez(workdir / "records" / "mine.npz", x=rng.random((40, 1, 8, 8), dtype=np.float32),
             y=rng.integers(0, 7, 40))
    (workdir / "dev").mkdir()
    assert main(["agent", "new-site", "hospital-a", "--target", "jetson-orin-nano", "--data", "records/mine.npz",
                 "--num-classes", "10", "-o", "dev/site.yaml"]) == 0
    site = load_site(workdir / "dev" / "site.yaml")
    assert (site.site, site.target, site.data.kind) == ("hospital-a", "jetson-orin-nano", "npz")
    assert site.data.path == (workdir / "records" / "mine.npz").resolve()
    assert site.data.model_metadata() == ((1, 8, 8), 10)  # --num-classes beats the labels' 7
    assert "../records/mine.npz" in (workdir / "dev" / "site.yaml").read_text()  # relative to the file
    graph = load_model(digits_cnn_onnx(0))
    assert len(load_records(site.data, graph).y) == 40  # the agent reads exactly these records


def test_new_site_takes_classes_from_labels_and_a_replacement_budget(workdir):
    with open(workdir / "d.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["a", "b", "c", "diagnosis"])
        for i in range(6):
            w.writerow([i, i + 1, i + 2, "benign" if i % 2 else "malignant"])
    assert main(["agent", "new-site", "h-1", "--target", "x86-64", "--data", "d.csv", "--label-column",
                 "diagnosis", "--epsilon-budget", "1.5"]) == 0
    site = load_site(workdir / "site.yaml")
    assert site.data.classes == ["benign", "malignant"] and site.data.model_metadata() == ((3,), 2)
    # a budget below one default round: the per-round ε is capped at what is left
    assert (site.privacy.epsilon_budget, site.privacy.epsilon_per_round) == (1.5, 1.5)


def test_new_site_from_an_image_folder_needs_the_record_shape(workdir, capsys):
    for name in ("cat", "dog"):
        (workdir / "imgs" / name).mkdir(parents=True)
    assert main(["agent", "new-site", "s", "--target", "x86-64", "--data", "imgs"]) == 2
    assert "--input-shape" in capsys.readouterr().err
    assert main(["agent", "new-site", "s", "--target", "x86-64", "--data", "imgs", "--input-shape", "3,16,16"]) == 0
    assert load_site(workdir / "site.yaml").data.model_metadata() == ((3, 16, 16), 2)


@pytest.mark.parametrize("args, fragment", [
    (["--data", "missing.npz"], "missing.npz does not exist"),
    (["--data", "bad.npz"], "needs 'x' (records) and 'y'"),
    (["--data", "notes.txt"], "not '.txt'"),
    (["--data", "ok.npz", "--target", "pdp-11"], "target"),
    (["--data", "ok.npz", "--epsilon-budget", "-1"], "epsilon_budget"),
    (["--data", "ok.npz", "--input-shape", "3,x"], "--input-shape"),
])
def test_new_site_refuses_bad_input_in_one_line_and_writes_nothing(workdir, capsys, args, fragment):
    np.savez(workdir / "bad.npz", records=np.zeros((2, 3)))
    np.savez(workdir / "ok.npz", x=np.zeros((2, 3)), y=np.zeros(2, np.int64))
    (workdir / "notes.txt").write_text("hello")
    command = ["agent", "new-site", "s", "--target", "x86-64", *args]
    if "--target" in args:
        command[3:5] = []
    assert main(command) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (workdir / "site.yaml").exists() and not list(workdir.glob(".site.yaml*"))


def test_new_site_keeps_an_existing_file_unless_forced(workdir, capsys):
    np.savez(workdir / "ok.npz", x=np.zeros((2, 3)), y=np.zeros(2, np.int64))
    (workdir / "site.yaml").write_text("# mine\n")
    assert main(["agent", "new-site", "s", "--target", "x86-64", "--data", "ok.npz"]) == 2
    assert "--force" in capsys.readouterr().err and (workdir / "site.yaml").read_text() == "# mine\n"
    assert main(["agent", "new-site", "s", "--target", "x86-64", "--data", "ok.npz", "--force"]) == 0
    assert load_site(workdir / "site.yaml").site == "s"


def _enroll(home: Path, site: str, target: str) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    node = ec.generate_private_key(ec.SECP384R1()).public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    SiteRegistry(home).enroll(Enrollment(site, target, node, site.encode().hex().ljust(64, "0")[:64]))


def test_federation_lists_exactly_the_enrolled_sites_and_keeps_tuned_site_files(workdir, capsys):
    home = workdir / "home"
    assert main(["coordinator", "federation", "--home", str(home), "--model", "builtin:digits-cnn"]) == 2
    assert "no site is enrolled" in capsys.readouterr().err
    init_home(home)
    _enroll(home, "hospital-a", "jetson-orin-nano")
    _enroll(home, "factory-b", "rpi4")
    (workdir / "configs" / "sites").mkdir(parents=True)
    tuned = "site: factory-b\ntarget: rpi4\nprivacy: {epsilon_budget: 3.0, epsilon_per_round: 1.0}\n"
    (workdir / "configs" / "sites" / "factory-b.yaml").write_text(tuned)
    assert main(["coordinator", "federation", "--home", str(home), "--model", "builtin:digits-cnn",
                 "--rounds", "3", "--min-sites", "1", "--name", "trial"]) == 0
    federation = load_federation(workdir / "configs" / "federation.yaml")
    assert (federation.name, federation.rounds, federation.min_sites) == ("trial", 3, 1)
    assert sorted(s.site for s in federation.load_sites()) == ["factory-b", "hospital-a"]
    assert (workdir / "configs" / "sites" / "factory-b.yaml").read_text() == tuned
    assert load_site(workdir / "configs" / "sites" / "hospital-a.yaml").target == "jetson-orin-nano"
    assert main(["coordinator", "federation", "--home", str(home), "--model", "builtin:digits-cnn"]) == 2
    assert "--force" in capsys.readouterr().err


def test_federation_with_an_onnx_model_and_own_test_records(workdir):
    home = workdir / "home"
    init_home(home)
    _enroll(home, "s1", "x86-64")
    (workdir / "model.onnx").write_bytes(digits_cnn_onnx(0))
    np.savez(workdir / "test.npz", x=np.zeros((4, 1, 8, 8), np.float32), y=np.arange(4))
    assert main(["coordinator", "federation", "--home", str(home), "--model", "model.onnx", "--test", "test.npz",
                 "-o", "fed/federation.yaml"]) == 0
    federation = load_federation(workdir / "fed" / "federation.yaml")
    assert Path(federation.model) == (workdir / "model.onnx").resolve()
    assert federation.dataset.test.path == (workdir / "test.npz").resolve()


def test_demo_data_writes_disjoint_shares_the_new_site_command_reads(workdir):
    assert main(["coordinator", "demo-data", "a", "b", "--out", "shares"]) == 0
    a, b = (np.load(workdir / "shares" / f"{s}.npz") for s in "ab")
    assert a["x"].shape[1:] == (1, 8, 8) and len(a["y"]) > 100 and len(b["y"]) > 100
    rows = {r.tobytes() for r in a["x"]}
    assert not any(r.tobytes() in rows for r in b["x"])  # no record is in two shares
    assert main(["coordinator", "demo-data", "a", "--out", "shares"]) == 2  # kept unless --force
    shutil.copy(workdir / "shares" / "a.npz", workdir / "a.npz")
    assert main(["agent", "new-site", "a", "--target", "rpi4", "--data", "a.npz"]) == 0
    assert load_site(workdir / "site.yaml").data.model_metadata() == ((1, 8, 8), 10)
