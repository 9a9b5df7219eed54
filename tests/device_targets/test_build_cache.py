"""The build cache: keyed by structure, so new weights reuse the module without
code generation; what is read back is checked, never trusted (authenticated by the
cache's own MAC key, and refused when not private to this user); concurrent builds of one key
succeed; and the cold path's shortcuts (memos, change tracking) leave the generated module as it was."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import marshal
import os
import re
import stat
import sys
import threading
from dataclasses import dataclass, replace

import numpy as np
import pytest

from cuvil_edge import private_dir
from cuvil_edge.device_targets import build, codegen, load_target
from cuvil_edge.device_targets import prune as prune_module
from cuvil_edge.device_targets import specialise as specialise_module
from cuvil_edge.errors import UnsafePathError
from cuvil_edge.ir import interpreter, ops
from cuvil_edge.ir.graph import Node, TensorType, Value
from cuvil_edge.ir.infer import build_graph, with_initializers

BUILD = sys.modules["cuvil_edge.device_targets.build"]  # the module (the package exports the function)
TARGETS = ["ascend-310", "jetson-orin-nano", "rpi4", "x86-64"]


@dataclass(frozen=True)
class Package:
    """Stands in for ir_serialize's VerifiedPackage (build() only needs these two)."""

    graph: object
    payload_digest: str


def _graph(shape=(-1, 2, 3), alpha=0.1, seed=0):
    """x[N, 6] -> Reshape(s) -> Mul(k) -> LeakyRelu(alpha) -> y: one non-float initializer (the
    shape), one float one (the weights), one attribute."""
    rng = np.random.default_rng(seed)
    nodes = [Node("sh", "Reshape", ("x", "s"), ("t",)), Node("mul", "Mul", ("t", "k"), ("u",)),
             Node("act", "LeakyRelu", ("u",), ("y",), {"alpha": alpha})]
    return build_graph("cache", [Value("x", TensorType("float32", ("N", 6)))], ["y"], nodes,
                       {"s": np.array(shape, np.int64), "k": rng.standard_normal(shape[1:]).astype(np.float32)}, 13)


def _digest(n: int) -> str:
    return f"{n:02x}" * 32


X = np.random.default_rng(1).standard_normal((5, 6)).astype(np.float32)


@pytest.fixture(autouse=True)
def fresh_memo(monkeypatch):
    """Each test starts as a fresh process would: no entries remembered in memory."""
    monkeypatch.setattr(BUILD, "_MEMO", {})


def _forget():
    """What a new process sees: only the files."""
    BUILD._MEMO.clear()


def _entries(root):
    """The cache's entry folders (beside them: its MAC key)."""
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def _mac_key(root) -> bytes:
    return (root / BUILD.KEY_FILE).read_bytes()


# --- new weights hit, without code generation, and compute with the new weights ---------------------
@pytest.mark.parametrize("fresh_process", [False, True])
@pytest.mark.parametrize("target", TARGETS)
def test_new_float_weights_hit_without_codegen_and_run_with_the_new_weights(tmp_path, monkeypatch, target,
                                                                             fresh_process):
    graph = _graph()
    first = build(Package(graph, _digest(1)), target, cache_dir=tmp_path)
    newer = with_initializers(graph, {"k": (graph.initializers["k"] * -3 + 1).astype(np.float32)})
    if fresh_process:
        _forget()

    def refuse(*args, **kwargs):
        raise AssertionError("code generation ran on a cache hit")

    monkeypatch.setattr(codegen, "generate_source", refuse)
    monkeypatch.setattr(codegen, "specialise_function", refuse)  # the name codegen calls
    model = build(Package(newer, _digest(2)), target, cache_dir=tmp_path)
    assert (first.cache_hit, model.cache_hit) == (False, True) and model.key == first.key
    np.testing.assert_allclose(model.run({"x": X})["y"], interpreter.run(newer, {"x": X})["y"], rtol=1e-3, atol=1e-3)
    assert not np.allclose(model.run({"x": X})["y"], first.run({"x": X})["y"])
    assert _entries(tmp_path) == [first.key]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([BUILD.KEY_FILE, first.key])


@pytest.mark.parametrize("change", ["reshape shape", "attribute"])
def test_a_changed_non_float_initializer_or_attribute_is_a_miss(tmp_path, change):
    first = build(Package(_graph(), _digest(1)), "x86-64", cache_dir=tmp_path)
    other = _graph(shape=(-1, 3, 2)) if change == "reshape shape" else _graph(alpha=0.25)
    model = build(Package(other, _digest(2)), "x86-64", cache_dir=tmp_path)
    assert not model.cache_hit and model.key != first.key
    np.testing.assert_allclose(model.run({"x": X})["y"], interpreter.run(other, {"x": X})["y"], rtol=1e-5, atol=1e-6)


def test_a_fresh_process_hit_loads_the_marshalled_code_and_compiles_nothing(tmp_path, monkeypatch):
    first = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    _forget()
    monkeypatch.setattr(BUILD, "_compile", lambda *a: pytest.fail("compiled on a hit with an intact module.code"))
    again = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    assert again.cache_hit and again.source == first.source
    np.testing.assert_array_equal(again.run({"x": X})["y"], first.run({"x": X})["y"])


def test_an_in_process_hit_reuses_the_code_but_still_checks_the_source(tmp_path, monkeypatch):
    first = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    calls = []
    for name in ("_compile", "_read_code"):
        real = getattr(BUILD, name)
        monkeypatch.setattr(BUILD, name, lambda *a, _name=name, _real=real: calls.append(_name) or _real(*a))
    assert build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path).cache_hit and calls == []
    first.source_path.write_text(first.source + "\n# edited\n")  # no longer what meta.json names
    again = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    assert not again.cache_hit and again.source == first.source and calls == ["_compile"]


def test_each_compiled_model_gets_its_own_module_namespace(tmp_path):
    one = build(Package(_graph(), _digest(1)), "x86-64", cache_dir=tmp_path)
    two = build(Package(_graph(), _digest(1)), "x86-64", cache_dir=tmp_path)
    assert two.cache_hit and one._entry is not two._entry and one._entry.__globals__ is not two._entry.__globals__


# --- what is read back is checked ---------------------------------------------------------------------
def _truncate(path):
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _header(code_bytes: bytes) -> tuple[bytes, bytes]:
    return code_bytes[:BUILD._CODE_HEADER], code_bytes[BUILD._CODE_HEADER:]


def _planted(text: str, path) -> bytes:
    """A well-formed module.code holding ``text`` compiled, for the real source, whose MAC is made
    under a key of the attacker's own (the cache's is not theirs to read)."""
    source_sha = hashlib.sha256(path.with_name("module.py").read_bytes()).digest()
    return BUILD._code_bytes(compile(text, str(path.with_name("module.py")), "exec"), os.urandom(32), path.parent,
                             source_sha)


def _other_entry_mac(meta_path) -> str:
    """The real key's MAC of this very source, made for another entry's key."""
    source = meta_path.with_name("module.py").read_bytes()
    return private_dir.mac(_mac_key(meta_path.parents[1]), b"cuvil-edge build module.py", b"0" * 64, source).hex()


EVIL = "def run(W, feeds):\n    raise SystemExit('planted code ran')\nBUILT_FOR = {'target': 'rpi4'}\n"

CORRUPTIONS = {
    "module.py truncated": ("module.py", _truncate, False),
    "module.py byte flipped": ("module.py", _flip_last_byte, False),
    "module.py missing": ("module.py", lambda p: p.unlink(), False),
    "meta.json truncated": ("meta.json", _truncate, False),
    "meta.json not an object": ("meta.json", lambda p: p.write_text("[1, 2]"), False),
    "meta.json missing": ("meta.json", lambda p: p.unlink(), False),
    "meta.json wrong sha": ("meta.json", lambda p: p.write_text(json.dumps({"source_sha256": "0" * 64})), False),
    # module.code: the source is intact, so it is a hit, compiled again from module.py
    "module.code truncated": ("module.code", _truncate, True),
    "module.code header only": ("module.code", lambda p: p.write_bytes(p.read_bytes()[:BUILD._CODE_HEADER]), True),
    "module.code payload byte flipped": ("module.code", _flip_last_byte, True),
    "module.code missing": ("module.code", lambda p: p.unlink(), True),
    "module.code empty": ("module.code", lambda p: p.write_bytes(b""), True),
    "module.code other python": ("module.code", lambda p: p.write_bytes(
        BUILD._CODE_TAG + bytes(4) + p.read_bytes()[len(BUILD._CODE_TAG) + 4:]), True),
    "module.code planted, MAC under another key": ("module.code", lambda p: p.write_bytes(_planted(EVIL, p)), True),
    "module.code planted, payload digest stale": ("module.code", lambda p: p.write_bytes(
        _header(p.read_bytes())[0] + marshal.dumps(compile(EVIL, str(p.with_name("module.py")), "exec"))), True),
    "module.code not code, a sha256 for its MAC": ("module.code", lambda p: p.write_bytes(
        _header(p.read_bytes())[0][:-32] + hashlib.sha256(marshal.dumps(42)).digest() + marshal.dumps(42)), True),
    "meta.json MAC of another entry": ("meta.json", lambda p: p.write_text(json.dumps(
        {**json.loads(p.read_text()), "source_mac": _other_entry_mac(p)})), False),
}


@pytest.mark.parametrize("in_memory", [False, True], ids=["fresh process", "same process"])
@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_corrupted_cache_entry_is_rebuilt_not_trusted(tmp_path, case, in_memory):
    name, corrupt, still_a_hit = CORRUPTIONS[case]
    first = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    entry = first.source_path.parent
    corrupt(entry / name)
    if not in_memory:
        _forget()
    again = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    assert again.cache_hit == still_a_hit and again.source == first.source
    np.testing.assert_allclose(again.run({"x": X})["y"], interpreter.run(_graph(), {"x": X})["y"], rtol=1e-5, atol=1e-6)
    if in_memory and name == "module.code":  # the process reused what it had compiled: the next one repairs
        _forget()
        assert build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path).cache_hit
    # the entry is whole again: a fresh process takes it as a hit and compiles nothing
    sha = hashlib.sha256((entry / "module.py").read_bytes()).digest()
    assert BUILD._read_code(entry / "module.code", _mac_key(tmp_path), sha, entry / "module.py") is not None
    assert json.loads((entry / "meta.json").read_text())["source_sha256"] == sha.hex()


def test_module_code_from_a_moved_cache_folder_is_recompiled(tmp_path):
    first = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path / "a")
    (tmp_path / "a").rename(tmp_path / "b")
    _forget()
    again = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path / "b")
    assert again.cache_hit and again._entry.__code__.co_filename == str(again.source_path)
    assert first.source_path != again.source_path


def test_module_code_header_names_python_magic_and_holds_the_mac_of_its_source_and_code(tmp_path):
    model = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    entry = model.source_path.parent
    data = (entry / "module.code").read_bytes()
    tag, magic = BUILD._CODE_TAG, importlib.util.MAGIC_NUMBER
    assert data.startswith(tag + magic)
    mac = data[len(tag) + len(magic):BUILD._CODE_HEADER]
    parts = (b"cuvil-edge build module.code", model.key.encode(), magic, hashlib.sha256(model.source.encode()).digest(),
             data[BUILD._CODE_HEADER:])
    assert private_dir.mac_matches(_mac_key(tmp_path), mac, *parts)
    meta = json.loads((entry / "meta.json").read_text())
    assert private_dir.mac_matches(_mac_key(tmp_path), bytes.fromhex(meta["source_mac"]), b"cuvil-edge build module.py",
                                   model.key.encode(), model.source.encode())


# --- concurrency ------------------------------------------------------------------------------------
@pytest.mark.parametrize("round_", range(3))
def test_two_threads_building_one_key_at_once_both_succeed(tmp_path, round_):
    graphs = [_graph(), with_initializers(_graph(), {"k": np.ones((2, 3), np.float32)})]
    barrier, results, errors = threading.Barrier(2), [None, None], []

    def work(index):
        try:
            barrier.wait()
            model = build(Package(graphs[index], _digest(index + 1)), "x86-64", cache_dir=tmp_path)
            results[index] = (model, model.run({"x": X})["y"])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert results[0][0].key == results[1][0].key and results[0][0].source == results[1][0].source
    for (model, got), graph in zip(results, graphs):
        np.testing.assert_allclose(got, interpreter.run(graph, {"x": X})["y"], rtol=1e-5, atol=1e-6)
    _forget()
    assert build(Package(graphs[0], _digest(3)), "x86-64", cache_dir=tmp_path).cache_hit
    assert len(_entries(tmp_path)) == 1 and not list(tmp_path.glob("*/.*.tmp")) and not list(tmp_path.glob(".*.tmp"))


# --- the cold path's shortcuts leave the module as it was ---------------------------------------------
def test_specialisations_are_memoised_by_exact_literal_values():
    source = "def k(x, a):\n    if a is True:\n        return x\n    return x * a\n"
    results = {repr(v): specialise_module.specialise_function(source, "k_1", {"a": v})[0] for v in (1, 1.0, True, -0.0, 0.0)}
    assert len(set(results.values())) == 5, results
    assert specialise_module.specialise_function(source, "k_1", {"a": 1.0}) is \
        specialise_module.specialise_function(source, "k_1", {"a": 1.0})  # the memo answers


def test_pruning_marks_exactly_the_statements_it_changes():
    """prune() copies the text of statements its passes report unchanged: that report must agree
    with comparing the trees before and after, statement by statement (the demo CNN and this graph)."""
    from cuvil_edge.frontend import load_model
    from cuvil_edge.frontend.demo_model import digits_cnn_onnx

    for graph in (_graph(), load_model(digits_cnn_onnx(0))):
        source = codegen.generate_source(graph)
        for target in TARGETS:
            substitute = prune_module.Substitute(load_target(target).capabilities())
            fold = prune_module.Fold()
            for stmt in ast.parse(source).body:
                if substitute.is_constant_assignment(stmt):
                    continue
                before = ast.dump(stmt)
                substitute.changed = fold.changed = False
                after = fold.visit(substitute.visit(stmt))
                same = isinstance(after, ast.stmt) and ast.dump(after) == before
                assert (substitute.changed or fold.changed) == (not same), (target, before[:200])


def test_templates_digest_follows_the_kernel_files(tmp_path, monkeypatch):
    kernel = tmp_path / "my_kernel.py"
    kernel.write_text("def k_mine(x):\n    return x\n")
    spec = importlib.util.spec_from_file_location("my_kernel", kernel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(ops.registry(), "Relu", replace(ops.registry()["Relu"], fn=module.k_mine))
    before = codegen.templates_digest.__wrapped__()
    kernel.write_text("def k_mine(x):\n    return x + 0\n")
    assert codegen.templates_digest.__wrapped__() != before


# --- quantization data: only (De)QuantizeLinear reads it at run time, so its values do not key ------
def _qdq_graph(q, zero_point, shape=(2, 3)):
    """x[N, 6] -> Reshape(s) -> Mul(DequantizeLinear(q, scale, zp)) -> y: int8 weights and a zero
    point that only DequantizeLinear reads, next to a shape that Reshape reads."""
    nodes = [Node("dq", "DequantizeLinear", ("q", "scale", "zp"), ("k",)),
             Node("sh", "Reshape", ("x", "s"), ("t",)), Node("mul", "Mul", ("t", "k"), ("y",))]
    return build_graph("qdq", [Value("x", TensorType("float32", ("N", 6)))], ["y"], nodes,
                       {"q": np.asarray(q, np.int8).reshape(shape), "scale": np.array(0.05, np.float32),
                        "zp": np.array(zero_point, np.int8), "s": np.array((-1, *shape), np.int64)}, 13)


def test_new_int8_weights_hit_the_cache_and_run_with_their_own_values(tmp_path):
    """The attack on the exception: a cached module must never compute with the previous
    package's int8 values (they reach it at run time, like float weights)."""
    first_graph, second_graph = _qdq_graph(np.arange(6) - 3, 1), _qdq_graph(np.arange(6)[::-1] * 7, -4)
    first = build(Package(first_graph, _digest(1)), "x86-64", cache_dir=tmp_path)
    second = build(Package(second_graph, _digest(2)), "x86-64", cache_dir=tmp_path)
    assert (first.cache_hit, second.cache_hit) == (False, True) and first.key == second.key
    for model, graph in ((first, first_graph), (second, second_graph)):
        np.testing.assert_array_equal(model.run({"x": X})["y"], interpreter.run(graph, {"x": X})["y"])
    assert not np.allclose(second.run({"x": X})["y"], first.run({"x": X})["y"])


def test_an_int_tensor_another_op_also_reads_still_keys_the_cache(tmp_path):
    """Only data that (De)QuantizeLinear alone reads is left out: the same int32 tensor read by any
    other op (here Gather's indices, shared on purpose) keys the build by its values."""
    def shared(indices):
        nodes = [Node("dq", "DequantizeLinear", ("i", "scale"), ("f",)),
                 Node("pick", "Gather", ("x", "i"), ("y",), {"axis": 1})]
        return build_graph("shared", [Value("x", TensorType("float32", ("N", 6)))], ["y", "f"], nodes,
                           {"i": np.array(indices, np.int32), "scale": np.array(1.0, np.float32)}, 13)

    assert BUILD.structure_digest(shared([0, 1])) != BUILD.structure_digest(shared([4, 5]))
    first = build(Package(shared([0, 1]), _digest(1)), "x86-64", cache_dir=tmp_path)
    second = build(Package(shared([4, 5]), _digest(2)), "x86-64", cache_dir=tmp_path)
    assert not second.cache_hit
    np.testing.assert_array_equal(second.run({"x": X})["y"], X[:, 4:6])
    assert BUILD.structure_digest(_qdq_graph(np.arange(6), 0)) == BUILD.structure_digest(_qdq_graph(-np.arange(6), 5))
    assert BUILD.structure_digest(_qdq_graph(np.arange(6), 0)) != BUILD.structure_digest(
        _qdq_graph(np.arange(6), 0, shape=(3, 2)))


# --- attacks on the cache: one named test each ------------------------------------
def _marker_module(marker) -> str:
    """A module that would pass every check but the MAC: it writes ``marker`` when it is run."""
    return (f"open({str(marker)!r}, 'w').write('planted module ran')\n"
            "def run(W, feeds):\n    raise SystemExit('planted module ran')\nBUILT_FOR = {'target': 'rpi4'}\n")


def _rebuilt_and_correct(tmp_path, first):
    again = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    np.testing.assert_allclose(again.run({"x": X})["y"], interpreter.run(_graph(), {"x": X})["y"], rtol=1e-5, atol=1e-6)
    assert again.source == first.source and first.source_path.read_text() == first.source
    return again


@pytest.mark.parametrize("fresh_process", [True, False])
def test_swapped_module_with_matching_sha256_is_rebuilt_not_run(tmp_path, fresh_process):
    """module.py rewritten and meta.json's sha256 updated to match (anyone can compute a sha256):
    the MAC does not verify, so the module is generated again; the planted one never runs."""
    first = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    entry, marker = first.source_path.parent, tmp_path.parent / f"{tmp_path.name}-module-ran"
    evil = _marker_module(marker)
    first.source_path.write_text(evil)
    meta = json.loads((entry / "meta.json").read_text())
    (entry / "meta.json").write_text(json.dumps({**meta, "source_sha256": hashlib.sha256(evil.encode()).hexdigest()}))
    if fresh_process:
        _forget()
    try:
        again = _rebuilt_and_correct(tmp_path, first)
    finally:
        assert not marker.exists(), "the swapped module.py ran"
    assert not again.cache_hit


def test_swapped_module_code_is_rebuilt(tmp_path):
    """module.code replaced by planted code under a header of checkable hashes (the real source's
    sha256, the payload's own sha256, as a checked-hash .pyc would carry): it is not authenticated,
    so the checked module.py is compiled again and module.code rewritten; the planted code never runs."""
    first = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path)
    entry, marker = first.source_path.parent, tmp_path.parent / f"{tmp_path.name}-code-ran"
    payload = marshal.dumps(compile(_marker_module(marker), str(first.source_path), "exec"))
    (entry / "module.code").write_bytes(b"CUVLCODE" + importlib.util.MAGIC_NUMBER
                                        + hashlib.sha256(first.source.encode()).digest()
                                        + hashlib.sha256(payload).digest() + payload)
    _forget()
    try:
        again = _rebuilt_and_correct(tmp_path, first)
    finally:
        assert not marker.exists(), "the swapped module.code ran"
    assert again.cache_hit  # the source was intact: only its code was made again
    sha = hashlib.sha256(first.source.encode()).digest()
    assert BUILD._read_code(entry / "module.code", _mac_key(tmp_path), sha, first.source_path) is not None


def test_a_new_cache_is_private(tmp_path):
    root = tmp_path / "made" / "cache"
    model = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=root)
    entry = model.source_path.parent
    modes = {p.name: stat.S_IMODE(os.lstat(p).st_mode) for p in (root.parent, root, entry, root / BUILD.KEY_FILE,
                                                                   *entry.iterdir())}
    assert modes == {"made": 0o700, "cache": 0o700, model.key: 0o700, BUILD.KEY_FILE: 0o600,
                     "module.py": 0o600, "module.code": 0o600, "meta.json": 0o600}


def _built(tmp_path):
    model = build(Package(_graph(), _digest(1)), "rpi4", cache_dir=tmp_path / "cache")
    return model, tmp_path / "cache", model.source_path.parent


#: what is opened up -> (where, mode, what the message says to run)
OPENED = {"cache folder": (lambda root, entry: root, 0o777, "chmod 700"),
          "entry folder": (lambda root, entry: entry, 0o775, "chmod 700"),
          "module.py": (lambda root, entry: entry / "module.py", 0o666, "chmod 600"),
          "meta.json": (lambda root, entry: entry / "meta.json", 0o620, "chmod 600"),
          "module.code": (lambda root, entry: entry / "module.code", 0o602, "chmod 600"),
          "MAC key readable by others": (lambda root, entry: root / BUILD.KEY_FILE, 0o644, "chmod 600")}


@pytest.mark.parametrize("case", list(OPENED))
def test_group_or_other_writable_build_cache_is_refused(tmp_path, case):
    where, mode, fix = OPENED[case]
    _, root, entry = _built(tmp_path)
    path = where(root, entry)
    os.chmod(path, mode)
    _forget()
    named = re.escape(str(path))
    with pytest.raises(UnsafePathError, match=f"{named}.*group or others.*{fix} {named}"):
        build(Package(_graph(), _digest(1)), "rpi4", cache_dir=root)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
@pytest.mark.parametrize("name", ["cache folder", "entry folder", "module.py", "meta.json", "module.code"])
def test_foreign_owned_entry_is_refused(tmp_path, name):
    where, *_ = OPENED[name]
    _, root, entry = _built(tmp_path)
    path = where(root, entry)
    os.chown(path, 12345, -1)
    _forget()
    named = re.escape(str(path))
    with pytest.raises(UnsafePathError, match=f"{named} is owned by uid 12345.*rm -r {named}"):
        build(Package(_graph(), _digest(1)), "rpi4", cache_dir=root)


@pytest.mark.parametrize("name", ["module.py", "module.code", "entry folder", "cache folder"])
def test_symlinked_build_cache_entry_is_refused(tmp_path, name):
    """A link to a copy of the real file or folder (so the content would pass): refused, not followed."""
    import shutil

    where, *_ = OPENED[name]
    _, root, entry = _built(tmp_path)
    path = where(root, entry)
    copy = tmp_path / "elsewhere"
    (shutil.copytree if path.is_dir() else shutil.copy2)(path, copy)
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(copy)
    _forget()
    with pytest.raises(UnsafePathError, match=f"{re.escape(str(path))} is a symbolic link"):
        build(Package(_graph(), _digest(1)), "rpi4", cache_dir=root)
