"""`cuvil-edge agent init`: set up a device's state directory and its enrollment file.

On the device, once: the site's state directory (computed by config/home.py), its Flower
node-authentication key pair (EC P-384, OpenSSH format, what Flower 1.42 authenticates
SuperNodes with), its sealing key pair (X25519), the pinned trust root (stored in the
anti-rollback state, PACKAGE_SPEC §10.2) and the pinned CA certificate. The enrollment file
holds only public material; it is what the operator carries to the coordinator.

The state directory is private (see agent/runtime.py): init creates it 0700, makes an existing
one of ours 0700 (whatever its mode was), and refuses one that is a link or another user's, or
that holds such an entry or one writable by group or others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cuvil_edge import private_dir
from cuvil_edge.atomic import atomic_write
from cuvil_edge.config.enrollment import Enrollment
from cuvil_edge.config.home import site_state_dir
from cuvil_edge.config.site import SiteConfig
from cuvil_edge.errors import ConfigError, KeyFileError, StateError
from cuvil_edge.ir_serialize import AntiRollbackState
from cuvil_edge.ir_serialize.sealing import generate_seal_keypair, save_seal_keys

log = logging.getLogger(__name__)

NODE_KEY = "node_auth"
CA_FILE = "ca.crt"
ENROLLMENT_FILE = "enrollment.json"


def _private_state_dir(state: Path) -> None:
    """Create ``state`` 0700, or make the one of ours there 0700; then check its entries.

    Raises:
        UnsafePathError: it, or an entry in it, is not private (and cannot be made so here).
        StateError: it cannot be created or changed.
    """
    try:
        if private_dir.lstat(state) is not None and private_dir.tighten_dir(state, what="state directory"):
            log.warning("state directory %s was open to group or others; it is 0700 now", state)
        private_dir.ensure_private_dir(state, what="state directory", disposable=False)
        private_dir.check_entries(state, what="state directory", disposable=False)
    except OSError as e:
        raise StateError(
            f"cannot create or tighten the state directory {state}: {e}; fix its path or permissions"
        ) from e


@dataclass(frozen=True)
class SiteSetup:
    state_dir: Path
    enrollment_file: Path
    node_key: Path
    enrollment: Enrollment


def init_site(
    site: SiteConfig, trust_root: Path, *, ca: Path | None = None, home: Path | None = None, force: bool = False
) -> SiteSetup:
    """Create the site's state directory, keys and enrollment file; pin ``trust_root`` and ``ca``.

    Raises:
        KeyFileError: the site already has keys (``force`` replaces them: re-enroll afterwards),
            or ``trust_root``/``ca`` is unreadable.
        PackageError: ``trust_root`` is not a root.json signed by its own root keys.
        ConfigError: ``ca`` is not a PEM certificate.
        UnsafePathError: the state directory is a link or another user's, or an entry in it is
            a link, another user's or writable by group or others.
        StateError: the state directory cannot be created.
    """
    state = site_state_dir(site, home)
    _private_state_dir(state)
    keys = state / "keys"
    if (keys / NODE_KEY).exists() and not force:
        raise KeyFileError(
            f"{keys / NODE_KEY} exists: this device is already set up as site {site.site!r}; "
            "--force makes new keys (the coordinator must then enroll it again with --replace)"
        )
    try:
        pinned = Path(trust_root).read_bytes()
        ca_pem = Path(ca).read_bytes() if ca is not None else None
    except OSError as e:
        raise KeyFileError(f"cannot read {e.filename}: {e.strerror}") from e
    if ca_pem is not None:
        try:
            x509.load_pem_x509_certificate(ca_pem)
        except ValueError as e:
            raise ConfigError(f"{ca}: not a PEM certificate ({e})") from e
    AntiRollbackState(state).initialise(pinned)  # checks it is self-signed; kept once stored
    keys.mkdir(mode=0o700, parents=True, exist_ok=True)
    node = ec.generate_private_key(ec.SECP384R1())
    atomic_write(
        keys / NODE_KEY,
        node.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
        mode=0o600,
    )
    node_pub = node.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    atomic_write(keys / f"{NODE_KEY}.pub", node_pub + b"\n", mode=0o644)
    seal_private, seal_public = generate_seal_keypair()
    save_seal_keys(seal_private, keys)
    if ca_pem is not None:
        atomic_write(state / CA_FILE, ca_pem, mode=0o644)
    raw_seal = seal_public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    enrollment = Enrollment(site.site, site.target, node_pub.decode("ascii"), raw_seal.hex())
    atomic_write(state / ENROLLMENT_FILE, enrollment.to_json().encode("utf-8"), mode=0o644)
    log.info("site %s set up in %s", site.site, state)
    return SiteSetup(state, state / ENROLLMENT_FILE, keys / NODE_KEY, enrollment)
