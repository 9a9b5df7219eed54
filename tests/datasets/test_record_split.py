"""The per-record train / evaluation split (DESIGN §3 "Privacy").

Attacks, one named test each, on every source (npz, csv, image-folder, the demo's digits partition):

- ``add-last`` / ``remove-one`` / ``insert-first``: one record more or less changes the membership
  of exactly that record (:func:`test_one_record_changes_only_its_own_membership`);
- the same neighbours move the evaluation counts (correct, total) of a fixed model by at most
  (1, 1) (:func:`test_neighbours_move_the_evaluation_counts_by_at_most_one_each`);
- a Clopper-Pearson audit of the released counts (the agent's own ``CountsMechanism``) on a dataset
  and its neighbour with one record inserted first: passes at the charged epsilon, and detects the
  violation with half the noise (:func:`test_audit_of_the_evaluation_release_passes_at_the_charged_epsilon`,
  :func:`test_audit_of_the_evaluation_release_fails_with_half_the_noise`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import random
import stat
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from scipy.stats import beta

from cuvil_edge.agent import client_app
from cuvil_edge.config import load_site
from cuvil_edge.datasets import digits
from cuvil_edge.datasets.records import Records
from cuvil_edge.datasets.site_files import load_site_data
from cuvil_edge.datasets.split import PUBLIC_SPLIT_KEY, SPLIT_KEY_FILE, load_split_key, split_records
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx

KEY = bytes(range(32))  # a site's secret split key, fixed for the test
BASE = {"site": "clinic-x", "target": "x86-64", "privacy": {"epsilon_budget": 8.0, "epsilon_per_round": 2.0}}
FRACTION = 0.3


@pytest.fixture(scope="module")
def cnn():
    return load_model(digits_cnn_onnx(0))  # [batch, 1, 8, 8] -> 10 classes


def synthetic(n: int, seed: int) -> list[tuple[np.ndarray, int]]:
    """``n`` distinct records (1x8x8 grey levels, exact as PNG, CSV and npz) with labels 0/1."""
    rng = np.random.default_rng(seed)
    return [((rng.integers(0, 256, (1, 8, 8)) / 255).astype(np.float32), int(rng.integers(0, 2)))
            for _ in range(n)]


# --- the sources: write records, read them back split ----------------------------------------
def _site(folder: Path, data: dict):
    path = folder / "site.yaml"
    path.write_text(yaml.safe_dump({**BASE, "data": {**data, "eval_fraction": FRACTION}}))
    return load_site(path)


def _npz(folder: Path, records) -> dict:
    np.savez(folder / "d.npz", x=np.stack([x for x, _ in records]), y=np.array([y for _, y in records]))
    return {"kind": "npz", "path": "d.npz"}


def _csv(folder: Path, records) -> dict:
    header = ",".join([f"p{i}" for i in range(64)] + ["label"])
    rows = [",".join([repr(float(v)) for v in x.reshape(-1)] + [str(y)]) for x, y in records]
    (folder / "d.csv").write_text("\n".join([header, *rows]) + "\n")
    return {"kind": "csv", "path": "d.csv", "label_column": "label"}


def _images(folder: Path, records) -> dict:
    from PIL import Image

    for position, (x, y) in enumerate(records):  # file names follow the position: inserting first renames all
        (folder / "imgs" / "ab"[y]).mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.round(x[0] * 255).astype(np.uint8), mode="L").save(folder / "imgs" / "ab"[y] /
                                                                               f"{position:04d}.png")
    return {"kind": "image-folder", "path": "imgs"}


WRITERS = {"npz": _npz, "csv": _csv, "image-folder": _images}


def split_of(source: str, folder: Path, records, graph, key: bytes = KEY) -> tuple[Records, Records]:
    """(train, eval) of ``records`` read through ``source``, as the agent reads them."""
    if source == "digits-partition":
        part = Records(np.stack([x for x, _ in records]), np.array([y for _, y in records], np.int64))
        return split_records(part, FRACTION, key=key)
    folder.mkdir(parents=True)
    site = _site(folder, WRITERS[source](folder, records))
    return load_site_data(site.data, graph, cache_dir=folder / "data-cache", split_key=key)


def members(part: Records) -> Counter:
    return Counter((x.tobytes(), int(y)) for x, y in zip(part.x, part.y))


def base_records(source: str) -> list[tuple[np.ndarray, int]]:
    if source == "digits-partition":
        part = digits.site_partition(0, 3)
        return list(zip(part.x, part.y.tolist()))
    return synthetic(20 if source == "image-folder" else 60, seed=1)


def new_record(source: str) -> tuple[np.ndarray, int]:
    if source == "digits-partition":
        test = digits.global_test()
        return test.x[0], int(test.y[0])
    return synthetic(1, seed=99)[0]


ATTACKS = {
    "add-last": lambda records, new: (records + [new], new),
    "remove-one": lambda records, new: (records[:3] + records[4:], records[3]),
    "insert-first": lambda records, new: ([new] + records, new),
}
SOURCES = ["npz", "csv", "image-folder", "digits-partition"]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("attack", ATTACKS)
def test_one_record_changes_only_its_own_membership(tmp_path, cnn, source, attack):
    records = base_records(source)
    neighbour, changed = ATTACKS[attack](records, new_record(source))

    train, evaluation = split_of(source, tmp_path / "d", records, cnn)
    train2, evaluation2 = split_of(source, tmp_path / "d2", neighbour, cnn)

    a, b = (members(train), members(evaluation)), (members(train2), members(evaluation2))
    moved = sum(((x - y) + (y - x) for x, y in zip(a, b)), Counter())
    assert moved == Counter({(changed[0].tobytes(), changed[1]): 1})  # that record, in one part, once


# --- a fixed model's evaluation counts --------------------------------------------------------
def parity_model(x: np.ndarray, k: int = 1) -> np.ndarray:
    """A fixed classifier (labels 0/1): about half the synthetic records right, a different half
    for each ``k``."""
    return (np.round(x.reshape(len(x), -1).sum(axis=1) * 255).astype(np.int64) // k) % 2


def centroid_model(x: np.ndarray) -> np.ndarray:
    """A fixed classifier of digits: the nearest class mean of the public global test set."""
    test = digits.global_test()
    means = np.stack([test.x[test.y == c].reshape(-1, 64).mean(axis=0) for c in range(10)])
    return np.argmin(((x.reshape(len(x), 1, 64) - means[None]) ** 2).sum(axis=2), axis=1)


def counts(part: Records, model) -> np.ndarray:
    return np.array([int((model(part.x) == part.y).sum()) if len(part.y) else 0, len(part.y)])


#: Fixed models, several per source: the bound holds for each one.
MODELS = {"npz": [functools.partial(parity_model, k=k) for k in (1, 2, 3, 5, 7)],
          "digits-partition": [centroid_model]}


@pytest.mark.parametrize("source", ["npz", "digits-partition"])
@pytest.mark.parametrize("attack", ATTACKS)
def test_neighbours_move_the_evaluation_counts_by_at_most_one_each(tmp_path, cnn, source, attack):
    records = synthetic(1000, seed=2) if source == "npz" else base_records(source)
    neighbour, _ = ATTACKS[attack](records, new_record(source))

    evaluation = split_of(source, tmp_path / "d", records, cnn)[1]
    evaluation2 = split_of(source, tmp_path / "d2", neighbour, cnn)[1]

    for model in MODELS[source]:
        a, b = counts(evaluation, model), counts(evaluation2, model)
        assert np.all(np.abs(b - a) <= 1), (a, b)


# --- the empirical audit of the evaluation release --------------------------------------------
AUDIT_EPS, AUDIT_TRIALS, ALPHA = 0.5, 200_000, 1e-6


def _worst_insert_first(tmp_path: Path, graph) -> tuple[np.ndarray, np.ndarray]:
    """Counts of a 200-record npz dataset and of its neighbour with one record inserted first,
    the record chosen (of 30 candidates) to move the counts most, as an auditor would."""
    records = synthetic(200, seed=3)
    a = counts(split_of("npz", tmp_path / "base", records, graph)[1], parity_model)
    best = None
    for i, candidate in enumerate(synthetic(30, seed=4)):
        b = counts(split_of("npz", tmp_path / f"n{i}", [candidate] + records, graph)[1], parity_model)
        if best is None or np.abs(b - a).sum() > np.abs(best - a).sum():
            best = b
    return a, best


def _eps_lower_bound(plan, a: np.ndarray, b: np.ndarray, seed: int) -> float:
    """Clopper-Pearson lower bound on epsilon (ALPHA per event) from AUDIT_TRIALS releases of each
    input, over the events {loss >= t}, loss = |o - b|_1 - |o - a|_1 (the most powerful tests)."""
    outputs = {0: plan.apply(np.tile(a, (AUDIT_TRIALS, 1)), random.Random(seed)),
               1: plan.apply(np.tile(b, (AUDIT_TRIALS, 1)), random.Random(seed + 1))}
    inputs = {0: a, 1: b}
    bound = 0.0
    for p, q in ((0, 1), (1, 0)):  # events likelier under input p than under input q
        loss = {i: np.abs(outputs[i] - inputs[q]).sum(axis=1) - np.abs(outputs[i] - inputs[p]).sum(axis=1)
                for i in (p, q)}
        for t in np.unique(loss[p]):
            cp, cq = int((loss[p] >= t).sum()), int((loss[q] >= t).sum())
            if cq == AUDIT_TRIALS:
                continue
            lo = beta.ppf(ALPHA / 2, cp, AUDIT_TRIALS - cp + 1)
            hi = beta.ppf(1 - ALPHA / 2, cq + 1, AUDIT_TRIALS - cq)
            bound = max(bound, math.log(lo / hi))
    return bound


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory, cnn):
    return _worst_insert_first(tmp_path_factory.mktemp("audit"), cnn)


def test_audit_of_the_evaluation_release_passes_at_the_charged_epsilon(neighbours):
    a, b = neighbours
    plan = client_app.eval_mechanism(SimpleNamespace(privacy=SimpleNamespace(eval_epsilon=AUDIT_EPS))).plan(2, 1e-5)

    bound = _eps_lower_bound(plan, a, b, seed=11)

    assert np.abs(b - a).sum() == 2  # the worst neighbour: the sensitivity the mechanism is charged for
    assert bound <= AUDIT_EPS, (a, b, bound)


def test_audit_of_the_evaluation_release_fails_with_half_the_noise(neighbours):
    """Positive control: the audit has power (true epsilon 2 x the charged one)."""
    a, b = neighbours
    plan = client_app.eval_mechanism(SimpleNamespace(privacy=SimpleNamespace(eval_epsilon=AUDIT_EPS))).plan(2, 1e-5)
    broken = dataclasses.replace(plan, scale=plan.scale / 2)

    bound = _eps_lower_bound(broken, a, b, seed=13)

    assert bound > AUDIT_EPS, (a, b, bound)


# --- the rule's other properties ----------------------------------------------------------------
def test_duplicate_records_share_their_membership():
    records = synthetic(40, seed=5)
    doubled = Records(np.stack([x for x, _ in records] * 2), np.array([y for _, y in records] * 2))

    train, evaluation = split_records(doubled, FRACTION, key=KEY)

    assert all(n == 2 for n in members(train).values()) and all(n == 2 for n in members(evaluation).values())


def test_the_order_inside_each_part_does_not_follow_the_file():
    records = synthetic(60, seed=6)
    x, y = np.stack([x for x, _ in records]), np.array([y for _, y in records])

    forward = split_records(Records(x, y), FRACTION, key=KEY)
    backward = split_records(Records(x[::-1], y[::-1]), FRACTION, key=KEY)

    for one, other in zip(forward, backward):
        np.testing.assert_array_equal(one.x, other.x)
        np.testing.assert_array_equal(one.y, other.y)


def test_the_evaluation_share_is_eval_fraction_in_expectation():
    records = synthetic(4000, seed=7)
    x, y = np.stack([x for x, _ in records]), np.array([y for _, y in records])

    _, evaluation = split_records(Records(x, y), FRACTION, key=KEY)

    assert abs(len(evaluation.y) - 4000 * FRACTION) <= 6 * math.sqrt(4000 * FRACTION * (1 - FRACTION))


def test_another_key_draws_another_split():
    part = digits.site_partition(0, 3)

    one, other = split_records(part, FRACTION, key=KEY), split_records(part, FRACTION, key=bytes(32))

    assert members(one[1]) != members(other[1])


def test_the_agent_splits_under_its_own_secret_key_and_keeps_the_partition_cache(tmp_path, cnn):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({**BASE, "data": {"eval_fraction": FRACTION}}))
    agent = SimpleNamespace(site=load_site(path), state_dir=tmp_path / "state")
    agent.state_dir.mkdir(mode=0o700)
    context = SimpleNamespace(node_config={"home": str(tmp_path)})  # the deployment engine

    train, evaluation = client_app.local_data(agent, 0, 3, context, cnn)
    again = client_app.local_data(agent, 0, 3, context, cnn)

    key_file = agent.state_dir / SPLIT_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600 and len(key_file.read_bytes()) == 32
    expected = split_records(digits.site_partition(0, 3), FRACTION, key=load_split_key(agent.state_dir))
    for got in (train, evaluation), again:
        for part, want in zip(got, expected):
            np.testing.assert_array_equal(part.x, want.x)
            np.testing.assert_array_equal(part.y, want.y)
    assert members(evaluation) != members(split_records(digits.site_partition(0, 3), FRACTION,
                                                         key=PUBLIC_SPLIT_KEY)[1])
    assert len(list((agent.state_dir / "data-cache").glob("digits-*.npz"))) == 1  # records kept, no split
