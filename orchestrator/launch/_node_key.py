"""A remote child's TLS key and CSR, made on its node by its host (:mod:`._ray_node`).

The key is written on the node, in a new 0700 directory of the child's node directory, as a new
0600 file (never over anything there, never through a link), and only the CSR goes to the
supervisor, whose session CA signs it for the child's owner id
(:mod:`orchestrator.remote._ca`). The child renews its leaf itself with the same recipe
(``child._tls``); the two copies are apart because DESIGN §1 lets ``child`` and
``orchestrator`` share only ``ipc``, which takes no ``cryptography``.

It runs in the host's own process: made by a fresh ``python -m child._tls`` per child, the
interpreter's start and the import of ``cryptography`` were most of a remote child's launch
(64 children over four nodes spent 417 thread-seconds there; ``benchmarks/ray_fleet.py``).
"""

import os

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

__all__ = ["key_pem", "make_node_key", "new_key_and_csr"]


def new_key_and_csr(session: str, owner: str) -> tuple[ec.EllipticCurvePrivateKey, bytes]:
    """A fresh P-256 key (in memory) and the PEM CSR for ``fleet://SESSION/OWNER``."""
    key = ec.generate_private_key(ec.SECP256R1())
    uri = f"fleet://{session}/{owner}"
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, uri)]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(uri)]), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return key, csr.public_bytes(serialization.Encoding.PEM)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    """*key* as unencrypted PKCS#8 PEM."""
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_node_key(directory: str, session: str, owner: str) -> bytes:
    """Make *directory* (0700, new), write a fresh P-256 key there as ``key.pem`` (0600, new)
    and return the PEM CSR for ``fleet://SESSION/OWNER``."""
    key, csr = new_key_and_csr(session, owner)
    pem = key_pem(key)
    os.mkdir(directory, 0o700)  # FileExistsError for anything already there
    fd = os.open(
        os.path.join(directory, "key.pem"),
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return csr
