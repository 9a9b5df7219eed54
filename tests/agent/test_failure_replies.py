"""Nothing data-dependent leaves a site in a failure reply: one named attack per
case. Every malformed-data case of tests/agent/test_site_data.py's tables and every model mismatch is
delivered through the ClientApp (deployment engine: the site's own YAML and files) for a dataset and
its neighbour (one record added); the two replies are identical and carry only a code of the fixed
set (config/round_protocol.py), and nothing is charged."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, Metadata, RecordDict

from cuvil_edge.agent import client_app
from cuvil_edge.config import load_site
from cuvil_edge.config import round_protocol as rp
from cuvil_edge.config.home import site_state_dir
from cuvil_edge.config.round_protocol import Failures
from cuvil_edge.coordinator.keys import init_keys, load_signing_keys
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx
from cuvil_edge.ir_serialize import write_package
from cuvil_edge.privacy import PrivacyLedger

from tests.agent.test_site_data import CSV_FAULTS, NPZ_FAULTS

SITE = "clinic-x"
PRIVACY = {"epsilon_budget": 8.0, "epsilon_per_round": 2.0}
CODES = {f.code: f.name for f in Failures.all()}


def _torch_model(net, example_shape) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(2, *example_shape),), buffer, dynamo=False, input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return buffer.getvalue()


@pytest.fixture(scope="module")
def models():
    import torch

    nn = torch.nn
    return {
        "cnn": load_model(digits_cnn_onnx(0)),  # [batch, 1, 8, 8] -> 10 classes
        "mlp": load_model(_torch_model(nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)), (3,))),
        "other classes": load_model(_torch_model(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), (1, 8, 8))),
        "other input": load_model(_torch_model(nn.Sequential(nn.Linear(5, 10)), (5,))),
    }


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keys")
    key_file, root = init_keys(directory)
    return load_signing_keys(key_file), root


def _package(keys, graph, version: int = 1) -> bytes:
    signing, _ = keys
    now = int(time.time())
    return write_package(graph, site=SITE, target="x86-64", version=version, signing_key=signing.coordinator,
                         release_key=signing.release, issued_at=now, expires=now + 600, roots=signing.roots)


class Site:
    """One site on the deployment engine: its YAML, its files and its device home."""

    def __init__(self, root: Path, keys, data: dict):
        self.root, self.home = root, root / "home"
        root.mkdir(parents=True, exist_ok=True)
        self.file = root / "site.yaml"
        self.file.write_text(yaml.safe_dump({"site": SITE, "target": "x86-64", "privacy": PRIVACY, "data": data,
                                             "agent": {"trust_root": str(keys[1])}}))
        self.rounds = iter(range(1, 1000))

    def deliver(self, kind: str, package: bytes) -> Message:
        config = ConfigRecord({rp.SITE: SITE, rp.PACKAGE: package, rp.SERVER_ROUND: next(self.rounds)})
        meta = Metadata(run_id=1, message_id=f"m{time.monotonic_ns()}", src_node_id=0, dst_node_id=1,
                        reply_to_message_id="", group_id="", created_at=time.time(), ttl=600,
                        message_type=MessageType.TRAIN if kind == "train" else MessageType.EVALUATE)
        content = {rp.CONFIG_RECORD: config}
        if kind == "train":
            content[rp.ARRAYS_RECORD] = ArrayRecord()
        context = Context(run_id=1, node_id=1, node_config={"home": str(self.home), "site-config": str(self.file),
                                                              "partition-id": 0, "num-partitions": 1},
                          state=RecordDict(), run_config={})
        handler = client_app.train if kind == "train" else client_app.evaluate
        return handler(Message(content=RecordDict(content), metadata=meta), context)

    def ledger(self) -> PrivacyLedger:
        site = load_site(self.file)
        return PrivacyLedger(site_state_dir(site, self.home) / "ledger.sqlite", site=SITE,
                             epsilon_budget=site.privacy.epsilon_budget, delta=site.privacy.delta)


def _reply(reply: Message) -> tuple:
    """Everything a failure reply carries to the coordinator."""
    assert reply.has_error() and not reply.has_content()
    return reply.error.code, reply.error.reason


def _assert_code_only(replies: list[Message], failure) -> None:
    shown = {_reply(r) for r in replies}
    assert shown == {(failure.code, failure.name)}, shown


# --- malformed data: the tables of test_site_data, each with its neighbour ---------------------
def _npz_write(path: Path, content, extra: bool) -> None:
    """Write a NPZ_FAULTS case; ``extra``: its neighbour, one record more (a copy of the first)."""
    if isinstance(content, bytes):
        path.write_bytes(content + (bytes(64) if extra else b""))  # one more record's worth of bytes
        return
    if content is None:
        return  # a missing file has no record to add to
    arrays = {k: np.asarray(v) for k, v in content.items()}
    if extra:
        for name, arr in arrays.items():
            one = arr[:1] if len(arr) else np.zeros((1, *arr.shape[1:]), arr.dtype)  # the empty set: a zero record
            arrays[name] = np.concatenate([arr, one])
    np.savez(path, **arrays)


def _csv_text(text: str, extra: bool) -> str:
    """A CSV_FAULTS case; ``extra``: one record more (a copy of the first record, else a plain one)."""
    if not extra:
        return text
    lines = text.splitlines(keepends=True)
    return text + (lines[1] if len(lines) > 1 else "1,2,3,0\n")


#: Faults whose neighbour (one record more) is a valid dataset: a site with no records at all. The
#: loader refuses empty data, so "no records" vs "one record" is told apart (the reply to the one-record
#: neighbour is a noised, charged release); their own reply still carries the code alone.
EMPTY = {"npz": {"empty"}, "csv": {"header only"}}

NPZ_META = {"input_shape": [1, 8, 8], "num_classes": 10}
CSV_META = {"input_shape": [3], "num_classes": 2}


def _data_case(tmp_path, keys, models, source: str, fault: str, extra: bool) -> Site:
    root = tmp_path / ("neighbour" if extra else "dataset")
    root.mkdir()
    if source == "npz":
        _npz_write(root / "d.npz", NPZ_FAULTS[fault][0], extra)
        return Site(root, keys, {"kind": "npz", "path": "d.npz", **NPZ_META})
    text, options, _ = CSV_FAULTS[fault]
    (root / "d.csv").write_text(_csv_text(text, extra))
    meta = {"input_shape": CSV_META["input_shape"]} if "classes" in options else CSV_META
    return Site(root, keys, {"kind": "csv", "path": "d.csv", "label_column": "label", **meta, **options})


@pytest.mark.parametrize("source, fault", [("npz", f) for f in sorted(NPZ_FAULTS)] +
                         [("csv", f) for f in sorted(CSV_FAULTS)])
@pytest.mark.parametrize("kind", ["evaluate", "train"])
def test_malformed_data_replies_only_data_invalid_for_a_dataset_and_its_neighbour(tmp_path, keys, models, source,
                                                                                   fault, kind):
    package = _package(keys, models["cnn" if source == "npz" else "mlp"])
    dataset = _data_case(tmp_path, keys, models, source, fault, extra=False)
    replies = [dataset.deliver(kind, package)]
    if fault not in EMPTY[source]:
        replies.append(_data_case(tmp_path, keys, models, source, fault, extra=True).deliver(kind, package))
    _assert_code_only(replies, Failures.DATA_INVALID)
    assert dataset.ledger().spent() == 0  # nothing computed from the data left the device


def _images(root: Path, counts: dict[str, int]) -> None:
    from PIL import Image

    for label, (name, n) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new("L", (12, 12), 40 + 100 * label + i).save(root / name / f"{i}.png")


IMAGE_FAULTS = {  # the findings' names: a patient's file name, a rare class with no image
    "empty class folder": lambda imgs: (imgs / "rare-syndrome").mkdir(),
    "unreadable image": lambda imgs: (imgs / "b" / "patient-0042-smith-john.png").write_bytes(b"not a png"),
    "a file that is no image": lambda imgs: (imgs / "b" / "patient-0042-smith-john.dcm").write_bytes(b"DICM"),
}


@pytest.mark.parametrize("fault", sorted(IMAGE_FAULTS))
def test_malformed_image_folder_replies_only_data_invalid_for_a_dataset_and_its_neighbour(tmp_path, keys, models,
                                                                                         fault):
    package = _package(keys, models["cnn"])
    replies = []
    for extra in (False, True):
        root = tmp_path / ("neighbour" if extra else "dataset")
        _images(root / "imgs", {"a": 3 + extra, "b": 2})  # the neighbour: one image more in class a
        IMAGE_FAULTS[fault](root / "imgs")
        site = Site(root, keys, {"kind": "image-folder", "path": "imgs", **NPZ_META})
        replies.append(site.deliver("evaluate", package))
        assert site.ledger().spent() == 0
    _assert_code_only(replies, Failures.DATA_INVALID)


# --- model mismatches: refused from the public metadata, before any record is read -------------
def _valid_npz(root: Path, n: int) -> None:
    rng = np.random.default_rng(0)
    np.savez(root / "d.npz", x=rng.random((n, 1, 8, 8), np.float32), y=rng.integers(0, 10, n))


@pytest.mark.parametrize("model", ["mlp", "other classes", "other input"])
@pytest.mark.parametrize("kind", ["evaluate", "train"])
def test_a_model_mismatch_replies_only_model_incompatible_for_a_dataset_and_its_neighbour(tmp_path, keys, models,
                                                                                         model, kind):
    package = _package(keys, models[model])
    replies = []
    for n in (57, 58):  # the finding's dataset of 57 records, and its neighbour
        root = tmp_path / f"n{n}"
        root.mkdir()
        _valid_npz(root, n)
        site = Site(root, keys, {"kind": "npz", "path": "d.npz", **NPZ_META})
        replies.append(site.deliver(kind, package))
        assert site.ledger().spent() == 0 and site.ledger().history() == []  # refused before any claim
    _assert_code_only(replies, Failures.MODEL_INCOMPATIBLE)


def test_a_model_mismatch_is_refused_before_any_record_is_read(tmp_path, keys, models):
    site = Site(tmp_path, keys, {"kind": "npz", "path": "missing.npz", **NPZ_META})  # nothing to read at all
    _assert_code_only([site.deliver("evaluate", _package(keys, models["other classes"]))], Failures.MODEL_INCOMPATIBLE)


def test_without_public_metadata_every_package_is_refused(tmp_path, keys, models):
    _valid_npz(tmp_path, 20)
    site = Site(tmp_path, keys, {"kind": "npz", "path": "d.npz"})  # no data.input_shape / num_classes
    _assert_code_only([site.deliver("evaluate", _package(keys, models["cnn"]))], Failures.MODEL_INCOMPATIBLE)


def test_a_matching_model_is_evaluated_and_charged(tmp_path, keys, models):
    _valid_npz(tmp_path, 30)
    site = Site(tmp_path, keys, {"kind": "npz", "path": "d.npz", **NPZ_META})
    reply = site.deliver("evaluate", _package(keys, models["cnn"]))
    assert not reply.has_error() and set(reply.content[rp.METRICS_RECORD]) == set(
        rp.EVALUATE_REPLY.keys(rp.METRICS_RECORD))
    assert site.ledger().spent() > 0 and [r["status"] for r in site.ledger().history()] == ["committed"]


def test_a_package_for_another_site_replies_only_package_rejected(tmp_path, keys, models):
    _valid_npz(tmp_path, 20)
    site = Site(tmp_path, keys, {"kind": "npz", "path": "d.npz", **NPZ_META})
    signing, _ = keys
    now = int(time.time())
    other = write_package(models["cnn"], site="clinic-y", target="x86-64", version=1, signing_key=signing.coordinator,
                          release_key=signing.release, issued_at=now, expires=now + 600, roots=signing.roots)
    _assert_code_only([site.deliver("evaluate", other)], Failures.PACKAGE_REJECTED)
