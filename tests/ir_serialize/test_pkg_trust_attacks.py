"""One named test per attack on the trust chain, the floors and the parsers.

Every attack runs against the one entry point (verify_and_accept on a durable state) and
checks that the state file is byte-for-byte unchanged afterwards.
"""

from __future__ import annotations

import json

import pytest
from conftest import (EXPIRES, NOW, PKG_PRELUDE, accept_kwargs, build_payload, envelope_doc, make_keys, make_package,
                      mlp_graph, mutate_header, open_state, resign, sign_raw_payload, split_payload, state_bytes,
                      tensor_rows)

from cuvil_edge.errors import (
    BadNameError,
    ClockRollbackError,
    PackageFormatError,
    ReleaseRollbackError,
    RevokedKeyError,
    RollbackError,
    RootRotationError,
)
from cuvil_edge.ir_serialize import (
    encode_payload,
    generate_keypair,
    key_id,
    make_root,
    sign_root,
    verify_and_accept,
)
from cuvil_edge.ir_serialize.container import _decode_payload, align
from cuvil_edge.ir_serialize.dsse import sign_envelope
from cuvil_edge.ir_serialize.trust import ROOT_TYPE, load_pinned_root, update_root

FAR = EXPIRES + 10**6
MAX_VERSION = 2**63 - 1


def root_json(version, keys, signers, **role_overrides):
    """root.json bytes for ``keys`` (role -> private key), some roles replaced, signed by ``signers``."""
    roles = {role: [k.public_key()] for role, k in {**keys, **role_overrides}.items()}
    return sign_root(make_root(version, FAR, roles), signers)


def link(data: bytes):
    return json.loads(data)


def accept(state, pkg, **over):
    return verify_and_accept(pkg, state, **accept_kwargs(**over))


@pytest.fixture
def fed(tmp_path, keys):
    """A federation at root v1 and an agent state pinned to it."""
    v1 = root_json(1, keys, [keys["root"]])
    return v1, open_state(tmp_path / "state", v1, None)


def refused(state, pkg, error, **over):
    before = state_bytes(state)
    with pytest.raises(error):
        accept(state, pkg, **over)
    assert state_bytes(state) == before, "a refused package changed the state"


# --- root chain: only links signed by the previous root apply, revocations stick --------------------------
def test_forged_root_appended_after_genuine_rotation_refused(tmp_path, keys, fed):
    v1, state = fed
    new_coord = generate_keypair()[0]
    v2 = root_json(2, keys, [keys["root"]], coordinator=new_coord)
    graph = mlp_graph()
    accept(state, make_package(graph, keys, version=1, signing_key=new_coord, roots=[link(v2)]))
    attacker = make_keys()
    evil2 = root_json(2, attacker, [attacker["root"]])
    evil3 = root_json(3, attacker, [attacker["root"]])
    for chain in ([v2, evil2], [v2, evil3], [evil2], [evil3], [v1, v2, evil2]):
        refused(state, make_package(graph, attacker, version=2, roots=[link(c) for c in chain]), RootRotationError)
    # ...and an agent still at v1 refuses the same chains
    fresh = open_state(tmp_path / "fresh", v1, None)
    refused(fresh, make_package(graph, attacker, version=2, roots=[link(v2), link(evil2)]), RootRotationError)
    assert state.trust_root().version == 2 and fresh.trust_root().version == 1


def test_old_root_appended_after_revocation_refused(keys, fed):
    v1, state = fed
    new_coord = generate_keypair()[0]
    v2 = root_json(2, keys, [keys["root"]], coordinator=new_coord)  # drops (revokes) keys["coordinator"]
    graph = mlp_graph()
    accept(state, make_package(graph, keys, version=1, signing_key=new_coord, roots=[link(v2)]))
    stolen = keys  # the attacker holds the revoked coordinator key
    for chain in ([v2, v1], [v1]):
        refused(state, make_package(graph, stolen, version=2, roots=[link(c) for c in chain]), RootRotationError)
    refused(state, make_package(graph, stolen, version=2, roots=[link(v1), link(v2)]), RevokedKeyError)
    assert accept(state, make_package(graph, keys, version=2, signing_key=new_coord)).root_version == 2


def test_revoked_key_relisted_by_a_later_root_stays_refused(keys, fed):
    _, state = fed
    new_coord = generate_keypair()[0]
    v2 = root_json(2, keys, [keys["root"]], coordinator=new_coord)
    v3 = root_json(3, keys, [keys["root"]])  # lists the revoked coordinator key again
    graph = mlp_graph()
    accept(state, make_package(graph, keys, version=1, signing_key=new_coord, roots=[link(v2)]))
    refused(state, make_package(graph, keys, version=2, roots=[link(v2), link(v3)]), RootRotationError)
    rotated = update_root(load_pinned_root(root_json(1, keys, [keys["root"]])), v2)
    with pytest.raises(RootRotationError, match="revoked"):
        update_root(rotated, v3)


def test_state_stores_exactly_the_root_that_was_applied(keys, fed):
    _, state = fed
    c2, c3 = generate_keypair()[0], generate_keypair()[0]
    v2 = root_json(2, keys, [keys["root"]], coordinator=c2)
    v3 = root_json(3, keys, [keys["root"]], coordinator=c3)
    graph = mlp_graph()
    assert accept(state, make_package(graph, keys, version=1, signing_key=c3, roots=[link(v2), link(v3)])).root_version == 3
    stored = json.loads(state.path.read_bytes())
    assert stored["root"] == link(v3) and sorted(stored["revoked"]) == sorted(
        [_kid(keys["coordinator"]), _kid(c2)])
    accept(state, make_package(graph, keys, version=2, signing_key=c3, roots=[link(v2), link(v3)]))
    assert json.loads(state.path.read_bytes())["root"] == link(v3)


def test_root_link_is_not_parsed_before_its_signature_is_checked(keys, fed):
    _, state = fed
    attacker = make_keys()["root"]
    graph = mlp_graph()
    for body in (b"{" * 5000, b"\xff\xfe not json", b"[" * 990 + b"]" * 990):
        forged = sign_envelope(ROOT_TYPE, body, [attacker]).to_dict()
        refused(state, make_package(graph, keys, version=2, roots=[forged]), RootRotationError)


def test_root_chain_listing_one_root_twice_refused(keys, fed):
    _, state = fed
    v2 = root_json(2, keys, [keys["root"]])
    refused(state, make_package(mlp_graph(), keys, roots=[link(v2), link(v2)]), RootRotationError)


def _kid(private):
    return key_id(private.public_key())


# --- floors: a stolen key's lockout ends with its rotation; the clock floor cannot be pushed --------------
def test_stolen_coordinator_key_lockout_ends_with_its_rotation(keys, fed):
    _, state = fed
    graph = mlp_graph()
    accept(state, make_package(graph, keys, version=MAX_VERSION))  # the thief's package: validly signed
    with pytest.raises(RollbackError):
        accept(state, make_package(graph, keys, version=6))  # every genuine package is locked out
    new_coord = generate_keypair()[0]
    v2 = root_json(2, keys, [keys["root"]], coordinator=new_coord)
    genuine = accept(state, make_package(graph, keys, version=6, signing_key=new_coord, roots=[link(v2)]))
    assert genuine.manifest.version == 6 and state.last_accepted(genuine.manifest.site).version == 6
    refused(state, make_package(graph, keys, version=MAX_VERSION, roots=[link(v2)]), RevokedKeyError)
    refused(state, make_package(graph, keys, version=5, signing_key=new_coord), RollbackError)  # floor holds again


def test_stolen_release_key_lockout_ends_with_its_rotation(keys, fed):
    _, state = fed
    graph = mlp_graph()
    accept(state, make_package(graph, keys, version=1, release_counter=MAX_VERSION))
    with pytest.raises(ReleaseRollbackError):
        accept(state, make_package(graph, keys, version=2, release_counter=4))
    new_release = generate_keypair()[0]
    v2 = root_json(2, keys, [keys["root"]], release=new_release)
    accept(state, make_package(graph, keys, version=2, release_key=new_release, release_counter=4, roots=[link(v2)]))
    assert state.snapshot().releases == {"model": 4}


def test_future_dated_packages_do_not_push_the_time_floor(keys, fed):
    _, state = fed
    graph = mlp_graph()
    for version in range(1, 121):  # each issued as far in the future as the skew allows
        floor = max(NOW, state.snapshot().time_floor)
        accept(state, make_package(graph, keys, version=version, issued_at=floor + 300, expires=floor + 400 * 3600))
    assert state.snapshot().time_floor <= NOW
    genuine = make_package(graph, keys, version=121, issued_at=NOW, expires=NOW + 8 * 3600)
    assert accept(state, genuine).manifest.version == 121


def test_clock_set_back_after_acceptance_still_caught(keys, fed):
    _, state = fed
    graph = mlp_graph()
    accept(state, make_package(graph, keys, version=1, issued_at=NOW - 10, expires=NOW + 3600))
    old = make_package(graph, keys, version=2, issued_at=NOW - 7200, expires=NOW - 3600)
    refused(state, old, ClockRollbackError, now=NOW - 5000)  # the device clock went back 5000 s


# --- deep nesting in the envelope or signed header is a typed PackageFormatError --------------------------
@pytest.mark.parametrize("depth", [33, 990, 5000])
def test_deeply_nested_envelope_json_is_a_typed_error(keys, fed, depth):
    _, state = fed
    doc, payload = envelope_doc(make_package(mlp_graph(), keys))
    env = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    env = env.replace(b'"roots":[]', b'"roots":[' + b"[" * depth + b"]" * depth + b"]")
    head = PKG_PRELUDE.pack(b"CUVLSPK\0", 2, len(env), 0) + env
    refused(state, head + bytes(align(len(head)) - len(head)) + payload, PackageFormatError)


@pytest.mark.parametrize("depth", [33, 990, 5000])
def test_deeply_nested_signed_header_is_a_typed_error(keys, fed, depth):
    _, state = fed
    payload = encode_payload(mlp_graph())
    bad = mutate_header(payload, lambda d: d["graph"]["nodes"][0]["attrs"].update(alpha="PLACEHOLDER"))
    header, data = split_payload(bad)
    header = header.replace(b'"PLACEHOLDER"', b"[" * depth + b"]" * depth)
    refused(state, sign_raw_payload(build_payload(header, data), tensor_rows(payload), keys), PackageFormatError)


# --- control characters in the graph's other string fields (op types, dtypes) -----------------------------
CONTROLS = [chr(c) for c in range(0x20)] + ["\x7f"]
STRING_FIELDS = {
    "op type": lambda d, s: d["graph"]["nodes"][0].update(op=s),
    "value dtype": lambda d, s: d["graph"]["inputs"][0].update(dtype=s),
    "tensor dtype": lambda d, s: d["tensors"][0].update(dtype=s),
}


@pytest.mark.parametrize("field", STRING_FIELDS)
@pytest.mark.parametrize("at", ["first", "inside", "last"])
def test_every_control_character_is_refused_in_string_fields(field, at):
    payload = encode_payload(mlp_graph())
    for control in CONTROLS:
        text = {"first": control + "Relu", "inside": "Re" + control + "lu", "last": "Relu" + control}[at]
        with pytest.raises(PackageFormatError, match="contains control characters"):
            _decode_payload(mutate_header(payload, lambda d, text=text: STRING_FIELDS[field](d, text)))


@pytest.mark.parametrize("field", STRING_FIELDS)
@pytest.mark.parametrize("char", [" ", "~", "\x80", "\u00e9"], ids=["space", "tilde", "c1-first", "e-acute"])
def test_printable_neighbours_of_the_controls_are_not_refused_as_controls(field, char):
    payload = encode_payload(mlp_graph())
    try:
        _decode_payload(mutate_header(payload, lambda d: STRING_FIELDS[field](d, "Re" + char + "lu")))
    except PackageFormatError as e:  # refused for what it names (an unknown op or dtype), not as a control
        assert "control characters" not in str(e)


# --- names: controls, bidi, separators and paths refused in every field an agent reads --------------------
BAD_NAMES = {
    "c1-control": "a\x85b", "bidi-override": "a\u202eb", "bidi-isolate": "a\u2066b", "line-separator": "a\u2028b",
    "paragraph-separator": "a\u2029b", "bom": "\ufeffa", "backslash": "a\\b", "drive-letter": "C:x",
}


@pytest.mark.parametrize("field", ["site", "package", "target"])
@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_bad_identifier_names_refused(keys, fed, field, name):
    _, state = fed
    pkg = make_package(mlp_graph(), keys)

    def set_name(d):
        if field in d:
            d[field] = name
        if field == "target" and "targets" in d:
            d["targets"] = [name]

    bad = resign(pkg, keys, manifest=set_name, release=set_name)
    refused(state, bad, BadNameError, **({field: name} if field in ("site", "target") else {}))


def _rename_value(d, old, new):
    g = d["graph"]
    for n in g["nodes"]:
        n["inputs"] = [new if x == old else x for x in n["inputs"]]
        n["outputs"] = [new if x == old else x for x in n["outputs"]]
    for v in g["inputs"] + g["outputs"]:
        v["name"] = new if v["name"] == old else v["name"]


@pytest.mark.parametrize("place", ["node", "value", "attribute", "symbol"])
@pytest.mark.parametrize("name", BAD_NAMES.values(), ids=BAD_NAMES.keys())
def test_bad_graph_names_refused(place, name):
    payload = encode_payload(mlp_graph())
    change = {
        "node": lambda d: d["graph"]["nodes"][0].update(name=name),
        "value": lambda d: _rename_value(d, "h", name),
        "attribute": lambda d: d["graph"]["nodes"][0]["attrs"].update({name: 1}),
        "symbol": lambda d: d["graph"]["inputs"][0].update(shape=[name, 4]),
    }[place]
    with pytest.raises(BadNameError):
        _decode_payload(mutate_header(payload, change))


@pytest.mark.parametrize("name", list(BAD_NAMES.values()) + ["/abs", "a/../b"],
                         ids=list(BAD_NAMES.keys()) + ["leading-slash", "dotdot"])
def test_bad_tensor_names_refused(name):
    payload = encode_payload(mlp_graph())

    def rename(d):
        for row in d["tensors"]:
            if row["name"] == "w1":
                row["name"] = name
        d["graph"]["initializers"] = [name if x == "w1" else x for x in d["graph"]["initializers"]]
        for n in d["graph"]["nodes"]:
            n["inputs"] = [name if x == "w1" else x for x in n["inputs"]]

    with pytest.raises(BadNameError):
        _decode_payload(mutate_header(payload, rename))


def test_header_region_with_a_name_refused(keys, fed):
    _, state = fed

    def name_header(d):
        d["regions"][0]["name"] = "x"

    refused(state, resign(make_package(mlp_graph(), keys), keys, manifest=name_header, release=name_header),
            BadNameError)


def test_writer_refuses_names_agents_would_refuse():
    from cuvil_edge.ir.graph import Node, TensorType, Value
    from cuvil_edge.ir.infer import build_graph

    g = build_graph("g", [Value("x\u202e", TensorType("float32", (1, 2)))], ["y"],
                    [Node("r", "Relu", ("x\u202e",), ("y",))], {}, 13)
    with pytest.raises(BadNameError):
        encode_payload(g)
