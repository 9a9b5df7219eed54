"""Config errors: one line naming the file, the key and what is expected."""

from pathlib import Path

import pytest

from cuvil_edge.config import load_federation, load_site
from cuvil_edge.errors import ConfigError

GOOD_SITE = """\
site: hospital-a
target: rpi4
privacy:
  epsilon_budget: 8.0
  epsilon_per_round: 2.0
"""


def write(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_good_site_loads_with_defaults(tmp_path):
    site = load_site(write(tmp_path, GOOD_SITE))
    assert site.site == "hospital-a"
    assert site.target == "rpi4"
    assert site.privacy.delta == 1e-5
    assert site.training.batch_size > 0
    assert site.limits.latency_ms is None and site.limits.memory_mb is None and site.limits.download_mb is None
    limited = load_site(write(tmp_path, GOOD_SITE + "limits:\n  latency_ms: 50\n  memory_mb: 512\n  download_mb: 8\n",
                              "limited.yaml"))
    assert (limited.limits.latency_ms, limited.limits.memory_mb, limited.limits.download_mb) == (50, 512, 8)


@pytest.mark.parametrize(
    "text, key, expected",
    [
        (GOOD_SITE.replace("site: hospital-a\n", ""), "site", "missing required key"),
        (GOOD_SITE + "colour: blue\n", "colour", "unknown key"),
        (GOOD_SITE.replace("epsilon_budget: 8.0", "epsilon_budget: lots"), "privacy.epsilon_budget", "valid number"),
        (GOOD_SITE.replace("target: rpi4", "target: pdp-11"), "target", "pdp-11"),
        (GOOD_SITE.replace("epsilon_per_round: 2.0", "epsilon_per_round: 9.0"), "privacy", "must not exceed"),
        (GOOD_SITE.replace("site: hospital-a", "site: Hospital A"), "site", "pattern"),
        (GOOD_SITE + "training:\n  batch_size: 0\n", "training.batch_size", "greater than or equal"),
        (GOOD_SITE + "limits:\n  memory_mb: 0\n", "limits.memory_mb", "greater than"),
        (GOOD_SITE + "limits:\n  latency: 5\n", "limits.latency", "unknown key"),
    ],
    ids=["missing-field", "unknown-key", "wrong-type", "unknown-target", "per-round-over-budget", "bad-id",
         "out-of-range", "zero-limit", "misspelt-limit"],
)
def test_site_errors_name_file_key_and_expectation(tmp_path, text, key, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_site(path)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {key}")
    assert expected in message


def test_unknown_target_lists_known_targets(tmp_path):
    with pytest.raises(ConfigError, match="rpi4"):
        load_site(write(tmp_path, GOOD_SITE.replace("target: rpi4", "target: pdp-11")))


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_site(tmp_path / "nope.yaml")


def test_duplicate_key_rejected(tmp_path):
    with pytest.raises(ConfigError, match="appears twice"):
        load_site(write(tmp_path, GOOD_SITE + "site: other\n"))


def test_not_a_mapping(tmp_path):
    with pytest.raises(ConfigError, match="mapping"):
        load_site(write(tmp_path, "- just\n- a list\n"))


def test_yaml_syntax_error(tmp_path):
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_site(write(tmp_path, "site: [unclosed\n"))


def test_federation_site_paths_are_relative_to_the_file(tmp_path):
    (tmp_path / "sites").mkdir()
    write(tmp_path / "sites", GOOD_SITE, "a.yaml")
    fed = write(tmp_path, "name: f\nrounds: 2\nmodel: builtin:digits-cnn\nsites: [sites/a.yaml]\n", "fed.yaml")
    sites = load_federation(fed).load_sites()
    assert [s.site for s in sites] == ["hospital-a"]


def test_federation_missing_model_file(tmp_path):
    fed = write(tmp_path, "name: f\nrounds: 2\nmodel: nothere.onnx\nsites: [a.yaml]\n", "fed.yaml")
    with pytest.raises(ConfigError, match=r"fed.yaml: model: .*not found"):
        load_federation(fed)


def test_federation_duplicate_site_ids(tmp_path):
    write(tmp_path, GOOD_SITE, "a.yaml")
    write(tmp_path, GOOD_SITE, "b.yaml")
    fed = write(tmp_path, "name: f\nrounds: 2\nmodel: builtin:digits-cnn\nsites: [a.yaml, b.yaml]\n", "fed.yaml")
    with pytest.raises(ConfigError, match="more than one site file"):
        load_federation(fed).load_sites()


def test_shipped_configs_are_valid():
    root = Path(__file__).resolve().parents[2] / "configs"
    federation = load_federation(root / "federation.yaml")
    sites = federation.load_sites()
    assert len({s.target for s in sites}) == len(sites) == 3


@pytest.mark.parametrize("extra, match", [
    ("min_sites: 3\n", "min_sites 3 is more than the 2 sites"),
    ("min_sites: 1\ncentral_dp:\n  enabled: true\n", "central_dp needs every site"),
])
def test_federation_min_sites_must_fit(tmp_path, extra, match):
    fed = write(tmp_path, "name: f\nrounds: 2\nmodel: builtin:digits-cnn\nsites: [a.yaml, b.yaml]\n" + extra,
                "fed.yaml")
    with pytest.raises(ConfigError, match=match):
        load_federation(fed)


@pytest.mark.parametrize("name", ["../x", "a/b", ".hidden", "", "a b", "x" * 65])
def test_federation_name_cannot_leave_its_folder(tmp_path, name):
    """The name is a folder in the home (checkpoints/<name>/, runs/<name>-<time>): `../x` would put
    checkpoints outside checkpoints/."""
    write(tmp_path, GOOD_SITE, "a.yaml")
    fed = write(tmp_path, f"name: '{name}'\nrounds: 2\nmodel: builtin:digits-cnn\nsites: [a.yaml]\n", "fed.yaml")
    with pytest.raises(ConfigError, match=r"fed.yaml: name"):
        load_federation(fed)


FEDERATION = "name: f\nrounds: 2\nmodel: builtin:digits-cnn\nsites: [a.yaml]\n"


@pytest.mark.parametrize("load, text, says", [
    (load_site, GOOD_SITE + "privcy: {}\ntrainig: {}\n",
     ["privcy: unknown key (did you mean privacy?)", "trainig: unknown key (did you mean training?)"]),
    (load_site, GOOD_SITE + "limits:\n  latency: 5\n", ["limits.latency: unknown key (did you mean latency_ms?)"]),
    (load_site, GOOD_SITE + "data:\n  kind: npz\n  pth: x.npz\n", ["data.pth: unknown key (did you mean path?)"]),
    (load_federation, FEDERATION + "round_timout: 5\nlimts: 2\n",
     ["round_timout: unknown key (did you mean round_timeout?)", "limts: unknown key (remove it or check"]),
    (load_federation, FEDERATION + "strategy:\n  name: fedadam\n  bet_1: 0.8\n",
     ["strategy.fedadam.bet_1: unknown key (did you mean beta_1?)"]),
    (load_federation, FEDERATION + "dataset:\n  test:\n    kind: csv\n    pth: t.csv\n",
     ["dataset.test.pth: unknown key (did you mean path?)"]),
], ids=["two-misspelt-sections", "nested", "nested-optional", "one-close-one-not", "tagged-union", "deep"])
def test_every_unknown_key_is_named_with_the_closest_valid_key(tmp_path, load, text, says):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and "more" not in message
    for fragment in says:
        assert fragment in message


def test_unknown_keys_come_before_missing_ones_and_every_one_is_named(tmp_path):
    path = write(tmp_path, "site: x\ntaget: rpi4\nprivacy: {epsilon_budget: 1, epsilon_per_round: 1}\n")
    with pytest.raises(ConfigError) as info:
        load_site(path)
    assert str(info.value) == (f"{path}: taget: unknown key (did you mean target?); "
                               "target: missing required key")


def test_past_eight_problems_the_rest_are_counted(tmp_path):
    extra = "".join(f"unknown_{i}: 1\n" for i in range(10))
    path = write(tmp_path, GOOD_SITE + extra)
    with pytest.raises(ConfigError) as info:
        load_site(path)
    message = str(info.value)
    assert "\n" not in message and message.endswith("; +2 more")
    assert [f"unknown_{i}:" in message for i in range(10)] == [True] * 8 + [False] * 2
