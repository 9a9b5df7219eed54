"""A site's own data: npz, csv and image-folder sources read on the device,
checked against the model the package carries, every failure one DataError naming file and key."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from cuvil_edge.config import load_site
from cuvil_edge.datasets.site_files import load_site_data, model_io
from cuvil_edge.errors import ConfigError, DataError
from cuvil_edge.frontend import load_model
from cuvil_edge.frontend.demo_model import digits_cnn_onnx

BASE = {"site": "clinic-x", "target": "x86-64", "privacy": {"epsilon_budget": 8.0, "epsilon_per_round": 2.0}}


@pytest.fixture(scope="module")
def cnn():
    return load_model(digits_cnn_onnx(0))  # [batch, 1, 8, 8] -> 10 classes


def site_with(tmp_path: Path, data: dict):
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({**BASE, "data": data}))
    return load_site(path)


def test_model_io_reads_the_record_shape_and_classes(cnn):
    assert model_io(cnn) == ((1, 8, 8), 10)


# --- npz -------------------------------------------------------------------------------------
def test_npz_records_are_split_into_train_and_eval(tmp_path, cnn):
    rng = np.random.default_rng(0)
    x, y = rng.random((50, 1, 8, 8), np.float32), rng.integers(0, 10, 50)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    site = site_with(tmp_path, {"kind": "npz", "path": "d.npz", "eval_fraction": 0.2})
    train, test = load_site_data(site.data, cnn, split_key=bytes(32))
    # per record (datasets.split): eval_fraction of the records in expectation, not exactly
    assert len(train.y) + len(test.y) == 50 and 0 < len(test.y) < 25 and train.x.dtype == np.float32
    assert all(len(p.y) for p in load_site_data(site.data, cnn, split_key=bytes(32)))
    other = load_site_data(site.data, cnn, split_key=bytes([1]) * 32)[1]  # another site key, another split
    assert sorted(map(bytes, other.x)) != sorted(map(bytes, test.x))
    together = np.concatenate([train.x, test.x])
    assert sorted(map(bytes, together)) == sorted(map(bytes, x))  # every record, once
    flat = tmp_path / "flat.npz"  # 64 features for a model that takes 1x8x8: reshaped
    np.savez(flat, x=x.reshape(50, 64), y=y)
    assert load_site_data(site_with(tmp_path, {"kind": "npz", "path": "flat.npz"}).data, cnn)[0].x.shape[1:] == (1, 8, 8)


NPZ_FAULTS = {
    "missing file": (None, r"does not exist"),
    "not an npz": (b"hello", r"not an .npz"),
    "no y": ({"x": np.zeros((4, 1, 8, 8))}, r"needs 'x' \(records\) and 'y'"),
    "wrong shape": ({"x": np.zeros((4, 3, 8, 8)), "y": np.zeros(4)}, r"shape \(3, 8, 8\).*takes \(1, 8, 8\)"),
    "label out of range": ({"x": np.zeros((4, 1, 8, 8)), "y": np.array([0, 1, 10, 2])},
                           r"label 10 of record 2 is out of range.*10 classes"),
    "negative label": ({"x": np.zeros((4, 1, 8, 8)), "y": np.array([0, -1, 1, 2])}, r"label -1 of record 1"),
    "fractional label": ({"x": np.zeros((4, 1, 8, 8)), "y": np.array([0, 1.5, 1, 2])}, r"label 1.5.*whole number"),
    "nan": ({"x": np.where(np.arange(256).reshape(4, 1, 8, 8) == 70, np.nan, 0.0), "y": np.zeros(4)},
            r"record 1 holds NaN"),
    "inf": ({"x": np.where(np.arange(256).reshape(4, 1, 8, 8) == 200, np.inf, 0.0), "y": np.zeros(4)},
            r"record 3 holds NaN or an infinite"),
    "empty": ({"x": np.zeros((0, 1, 8, 8)), "y": np.zeros(0)}, r"holds no record"),
    "more labels than records": ({"x": np.zeros((4, 1, 8, 8)), "y": np.zeros(5)}, r"4 records, 5 labels"),
    "pickled objects": ({"x": np.array([{"a": 1}] * 4, dtype=object), "y": np.zeros(4)}, r"not an .npz of plain"),
}


@pytest.mark.parametrize("fault", sorted(NPZ_FAULTS))
def test_malformed_npz_is_one_data_error_naming_the_file(tmp_path, cnn, fault):
    content, message = NPZ_FAULTS[fault]
    path = tmp_path / "d.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        np.savez(path, **content)
    site = site_with(tmp_path, {"kind": "npz", "path": "d.npz"})
    with pytest.raises(DataError, match=message) as error:
        load_site_data(site.data, cnn)
    assert "d.npz" in str(error.value) and "\n" not in str(error.value)


# --- csv -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mlp():
    import io

    import torch

    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(2, 3),), buffer, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    return load_model(buffer.getvalue())


def test_csv_selects_named_columns_and_maps_class_names(tmp_path, mlp):
    (tmp_path / "d.csv").write_text("id,a,b,c,diagnosis\n" + "".join(
        f"{i},{i},{i * 2},{i * 3},{'M' if i % 2 else 'B'}\n" for i in range(10)))
    site = site_with(tmp_path, {"kind": "csv", "path": "d.csv", "label_column": "diagnosis",
                                "feature_columns": ["a", "b", "c"], "classes": ["B", "M"], "eval_fraction": 0.5})
    train, test = load_site_data(site.data, mlp)
    x, y = np.concatenate([train.x, test.x]), np.concatenate([train.y, test.y])
    order = np.argsort(x[:, 0])
    np.testing.assert_array_equal(x[order], [[i, 2 * i, 3 * i] for i in range(10)])
    np.testing.assert_array_equal(y[order], [i % 2 for i in range(10)])


CSV_FAULTS = {
    "no label column": ("a,b,c\n1,2,3\n", {}, r"no column 'label' \(data.label_column\)"),
    "unknown feature": ("a,b,c,label\n1,2,3,0\n", {"feature_columns": ["a", "b", "z"]}, r"names \['z'\], not in"),
    "text in a feature": ("a,b,c,label\n1,2,3,0\n1,x,3,1\n", {}, r"line 3: column 'b' holds 'x', not a number"),
    "short row": ("a,b,c,label\n1,2,3,0\n1,2,1\n", {}, r"line 3: 3 fields, the header has 4"),
    "names without classes": ("a,b,c,label\n1,2,3,B\n", {}, r"names, not class indices; list them in data.classes"),
    "unknown class name": ("a,b,c,label\n1,2,3,X\n", {"classes": ["B", "M"]}, r"\['X'\].*not in data.classes"),
    "too many features": ("a,b,c,d,label\n1,2,3,4,0\n", {}, r"shape \(4,\).*takes \(3,\)"),
    "header only": ("a,b,c,label\n", {}, r"holds no record"),
    "empty file": ("", {}, r"empty file"),
    "nan": ("a,b,c,label\n1,2,3,0\n1,nan,3,1\n", {}, r"record 1 holds NaN"),
    "label out of range": ("a,b,c,label\n1,2,3,0\n1,2,3,2\n", {}, r"label 2 of record 1 is out of range"),
    "duplicate header": ("a,a,c,label\n1,2,3,0\n", {}, r"names a column twice"),
}


@pytest.mark.parametrize("fault", sorted(CSV_FAULTS))
def test_malformed_csv_is_one_data_error_naming_the_file(tmp_path, mlp, fault):
    text, extra, message = CSV_FAULTS[fault]
    (tmp_path / "d.csv").write_text(text)
    site = site_with(tmp_path, {"kind": "csv", "path": "d.csv", "label_column": "label", **extra})
    with pytest.raises(DataError, match=message) as error:
        load_site_data(site.data, mlp)
    assert "d.csv" in str(error.value) and "\n" not in str(error.value)


# --- image folders ---------------------------------------------------------------------------
def write_images(root: Path, counts: dict[str, int], size=(16, 12), mode="RGB"):
    from PIL import Image

    for label, (name, n) in enumerate(counts.items()):
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            value = 40 + 100 * label + i
            Image.new(mode, size, (value,) * 3 if mode == "RGB" else value).save(
                root / name / f"{i}.{'png' if i % 2 else 'jpg'}")


def test_image_folders_are_resized_to_the_model_and_labelled_by_folder(tmp_path, cnn):
    write_images(tmp_path / "imgs", {"a": 3, "b": 4})
    site = site_with(tmp_path, {"kind": "image-folder", "path": "imgs", "eval_fraction": 0.3})
    cache = tmp_path / "cache"
    train, test = load_site_data(site.data, cnn, cache_dir=cache)
    x, y = np.concatenate([train.x, test.x]), np.concatenate([train.y, test.y])
    assert x.shape == (7, 1, 8, 8) and sorted(y.tolist()) == [0, 0, 0, 1, 1, 1, 1]
    assert np.all(np.abs(x[y == 0] - 41 / 255) < 3 / 255) and np.all(x[y == 1] > 139 / 255)  # grey levels kept
    assert len(list(cache.glob("images-*.npz"))) == 1  # decoded once, then read from the cache
    again = load_site_data(site.data, cnn, cache_dir=cache)
    np.testing.assert_array_equal(again[0].x, train.x)
    write_images(tmp_path / "imgs", {"a": 4})  # one more image: a new cache entry, not the stale one
    assert sum(len(s.y) for s in load_site_data(site.data, cnn, cache_dir=cache)) == 8
    ordered = site_with(tmp_path, {"kind": "image-folder", "path": "imgs", "classes": ["b", "a"]})
    train, test = load_site_data(ordered.data, cnn)
    y = np.concatenate([train.y, test.y])
    assert sorted(y.tolist()) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_image_folder_faults_name_the_folder_or_file(tmp_path, cnn):
    write_images(tmp_path / "imgs", {"a": 2, "b": 2})
    site = site_with(tmp_path, {"kind": "image-folder", "path": "imgs"})
    (tmp_path / "imgs" / "c").mkdir()
    with pytest.raises(DataError, match=r"imgs/c: class 'c' has no image"):
        load_site_data(site.data, cnn)
    (tmp_path / "imgs" / "c" / "0.png").write_bytes(b"not a png")
    with pytest.raises(DataError, match=r"c/0.png: not a readable PNG/JPEG"):
        load_site_data(site.data, cnn)
    (tmp_path / "imgs" / "c" / "0.png").unlink()
    (tmp_path / "imgs" / "c" / "notes.txt").write_text("x")
    with pytest.raises(DataError, match=r"\['notes.txt'\] are not PNG/JPEG"):
        load_site_data(site.data, cnn)
    named = site_with(tmp_path, {"kind": "image-folder", "path": "imgs", "classes": ["a", "b", "d"]})
    with pytest.raises(DataError, match=r"no sub-folder for data.classes \['d'\]"):
        load_site_data(named.data, cnn)
    with pytest.raises(DataError, match=r"not a folder"):
        load_site_data(site_with(tmp_path, {"kind": "image-folder", "path": "imgs/a/0.jpg"}).data, cnn)


def test_more_class_folders_than_the_model_has_classes_is_refused(tmp_path, mlp):
    import io

    import torch

    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2))
    buffer = io.BytesIO()
    torch.onnx.export(net, (torch.zeros(2, 1, 8, 8),), buffer, dynamo=False, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    two_classes = load_model(buffer.getvalue())
    write_images(tmp_path / "imgs", {"a": 1, "b": 1, "c": 1})
    with pytest.raises(DataError, match=r"label 2 of record \d is out of range; the model has 2 classes"):
        load_site_data(site_with(tmp_path, {"kind": "image-folder", "path": "imgs"}).data, two_classes)


# --- the site YAML ---------------------------------------------------------------------------
@pytest.mark.parametrize("data, message", [
    ({"kind": "csv", "path": "d.csv"}, "needs label_column"),
    ({"kind": "npz"}, "kind npz needs path"),
    ({"kind": "npz", "path": "d.npz", "label_column": "y"}, "are for kind csv"),
    ({"kind": "digits-partition", "path": "d.npz"}, "reads no files"),
    ({"kind": "parquet", "path": "d.pq"}, "kind"),
    ({"kind": "csv", "path": "d.csv", "label_column": "y", "feature_columns": ["a", "a"]}, "distinct column"),
])
def test_the_data_section_is_checked_when_the_site_file_loads(tmp_path, data, message):
    with pytest.raises(ConfigError, match=message):
        site_with(tmp_path, data)


def test_relative_data_paths_are_relative_to_the_site_file(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "site.yaml"
    path.write_text(yaml.safe_dump({**BASE, "data": {"kind": "npz", "path": "../records.npz"}}))
    assert load_site(path).data.path == (tmp_path / "records.npz").resolve()


def test_the_coordinators_test_records_are_files_it_holds(tmp_path):
    from cuvil_edge.config import load_federation

    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(BASE))
    body = {"name": "f", "rounds": 1, "model": "builtin:digits-cnn", "sites": ["site.yaml"]}
    federation = tmp_path / "federation.yaml"
    federation.write_text(yaml.safe_dump({**body, "dataset": {"test": {"kind": "digits-partition"}}}))
    with pytest.raises(ConfigError, match="coordinator's own test records"):
        load_federation(federation)
    federation.write_text(yaml.safe_dump({**body, "dataset": {"test": {"kind": "npz", "path": "test.npz"}}}))
    assert load_federation(federation).dataset.test.path == (tmp_path / "test.npz").resolve()


# --- image files are untrusted input: one test per attack ----------------------
def _png_declaring(width: int, height: int) -> bytes:
    """A valid 1-bit greyscale PNG of ``width`` x ``height`` zeros: a few KB on disk, whatever it declares."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    row = b"\0" * (1 + (width + 7) // 8)  # filter byte, then the packed bits
    rows = zlib.compressobj(9)
    data = b"".join(rows.compress(row) for _ in range(height)) + rows.flush()
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0))
            + chunk(b"IDAT", data) + chunk(b"IEND", b""))


def _image_site(tmp_path: Path):
    write_images(tmp_path / "imgs", {"a": 2, "b": 2})
    return site_with(tmp_path, {"kind": "image-folder", "path": "imgs"})


@pytest.mark.parametrize("fmt, name", [("BMP", "evil.png"), ("TIFF", "evil.jpg"), ("GIF", "evil.png"),
                                       ("PPM", "evil.jpeg")])
def test_bmp_image_is_refused(tmp_path, cnn, fmt, name):
    """Another format under a PNG/JPEG name never reaches its decoder (BMP, TIFF, GIF, PPM)."""
    from PIL import Image

    site = _image_site(tmp_path)
    Image.new("L", (16, 12), 99).save(tmp_path / "imgs" / "a" / name, format=fmt)
    with pytest.raises(DataError, match=rf"a/{name}: not a readable PNG/JPEG image \(site images are decoded "
                                        r"as PNG or JPEG only"):
        load_site_data(site.data, cnn)


def test_eps_image_is_refused(tmp_path, cnn, monkeypatch):
    """An EPS named .jpg is refused without Pillow's EPS plugin ever looking for Ghostscript."""
    import io

    from PIL import EpsImagePlugin, Image

    site = _image_site(tmp_path)
    eps = io.BytesIO()
    Image.new("L", (16, 12), 99).save(eps, format="EPS")
    (tmp_path / "imgs" / "b" / "evil.jpg").write_bytes(eps.getvalue())
    ghostscript = []

    def spy(*args, **kwargs):  # stands in for running the `gs` binary on the site's file
        ghostscript.append("run")
        raise OSError("Ghostscript would have run here")

    def looked_for() -> bool:
        ghostscript.append("looked for")
        return True

    monkeypatch.setattr(EpsImagePlugin, "Ghostscript", spy)
    monkeypatch.setattr(EpsImagePlugin, "has_ghostscript", looked_for)
    with pytest.raises(DataError, match=r"b/evil.jpg: not a readable PNG/JPEG image"):
        load_site_data(site.data, cnn)
    assert ghostscript == []


def test_decompression_bomb_png_is_a_data_error(tmp_path, cnn):
    """200 Mpixel in a few KB: Pillow's own DecompressionBombError threshold; one DataError instead."""
    site = _image_site(tmp_path)
    bomb = _png_declaring(20000, 10000)
    assert len(bomb) < 64 * 1024
    (tmp_path / "imgs" / "a" / "bomb.png").write_bytes(bomb)
    with pytest.raises(DataError, match=r"a/bomb.png: declares more than \d+ pixels, the cap for this model's "
                                        r"8x8 input.*refused before decoding") as error:
        load_site_data(site.data, cnn)
    assert "20000" not in str(error.value) and "10000" not in str(error.value)  # nothing the file declares


def test_png_above_the_models_pixel_cap_is_refused_before_decoding(tmp_path, cnn):
    """32 Mpixel: below Pillow's thresholds (Pillow alone would decode it), above the cap for 8x8 input."""
    from cuvil_edge.datasets.site_files import pixel_cap

    site = _image_site(tmp_path)
    assert 8000 * 4000 > pixel_cap((1, 8, 8))
    (tmp_path / "imgs" / "b" / "huge.png").write_bytes(_png_declaring(8000, 4000))
    with pytest.raises(DataError, match=r"b/huge.png: declares more than 24000000 pixels"):
        load_site_data(site.data, cnn)


@pytest.mark.parametrize("record, cap", [((1, 8, 8), 24_000_000), ((3, 224, 224), 24_000_000),
                                         ((3, 512, 512), 256 * 512 * 512), ((3, 1024, 1024), 89_478_485)])
def test_the_pixel_cap_follows_the_model_input_within_fixed_bounds(record, cap):
    from cuvil_edge.datasets.site_files import pixel_cap

    assert pixel_cap(record) == cap


def test_symlink_outside_data_path_is_refused(tmp_path, cnn):
    """A link in a class folder to an image outside data.path is not followed."""
    from PIL import Image

    site = _image_site(tmp_path)
    (tmp_path / "outside").mkdir()
    Image.new("L", (16, 12), 7).save(tmp_path / "outside" / "secret.png")
    (tmp_path / "imgs" / "a" / "2.png").symlink_to(tmp_path / "outside" / "secret.png")
    with pytest.raises(DataError, match=r"imgs/a/2.png: a symbolic link; .*outside data.path"):
        load_site_data(site.data, cnn)


@pytest.mark.parametrize("link", ["class folder", "link inside data.path"])
def test_other_symlinks_in_an_image_folder_are_refused(tmp_path, cnn, link):
    site = _image_site(tmp_path)
    if link == "class folder":  # a whole class read from elsewhere
        write_images(tmp_path / "outside", {"c": 2})
        (tmp_path / "imgs" / "c").symlink_to(tmp_path / "outside" / "c", target_is_directory=True)
        where = "imgs/c"
    else:  # even a link that stays inside: the rule is "no links", not "links that look harmless"
        (tmp_path / "imgs" / "b" / "copy.png").symlink_to(tmp_path / "imgs" / "a" / "1.png")
        where = "imgs/b/copy.png"
    with pytest.raises(DataError, match=rf"{where}: a symbolic link"):
        load_site_data(site.data, cnn)


def test_a_link_swapped_in_after_the_listing_is_not_followed(tmp_path):
    """The open itself refuses links (O_NOFOLLOW, relative to the folder), not only the listing."""
    from PIL import Image

    from cuvil_edge.datasets.site_files import _image

    (tmp_path / "imgs" / "a").mkdir(parents=True)
    Image.new("L", (16, 12), 7).save(tmp_path / "secret.png")
    (tmp_path / "imgs" / "a" / "0.png").symlink_to(tmp_path / "secret.png")
    with pytest.raises(DataError, match=r"a/0.png: cannot be opened as a plain file inside data.path"):
        root = (tmp_path / "imgs").resolve()
        _image(root, root / "a" / "0.png", (1, 8, 8))
